"""A wide-and-deep recommender for the synthetic ``hybridpar_clicks`` data.

The deep part embeds the user and the item in large tables (the tables a
parameter-server cluster shards over its ps tasks) and the small categorical
features, and runs an MLP; the wide part is a linear model over the hashed
user-segment x item-category cross. Both add up to the click logits.
"""

from __future__ import annotations

import keras

from hybridpar.data.builders.clicks import NUM_CATEGORIES, NUM_ITEMS, NUM_SEGMENTS, NUM_USERS

WIDE_BUCKETS = NUM_SEGMENTS * NUM_CATEGORIES


def wide_and_deep(
    num_classes: int = 2,
    input_shape: tuple[int, ...] = (5,),
    embedding_dim: int = 16,
    num_users: int = NUM_USERS,
    num_items: int = NUM_ITEMS,
) -> keras.Model:
    """Wide-and-deep over ``[user, item, user_segment, item_category, hour]`` ids.

    ``user_embedding`` (num_users x embedding_dim) and ``item_embedding``
    (num_items x embedding_dim) are the large sparse tables.
    """
    if tuple(input_shape) != (5,):
        raise ValueError(
            "wide_and_deep reads [user, item, user_segment, item_category, hour] ids. "
            f"Received: input_shape={tuple(input_shape)}; expected (5,) (hybridpar_clicks)."
        )
    ids = keras.Input((5,), dtype="int64", name="features")
    user, item, segment, category, hour = (ids[:, i] for i in range(5))
    deep = keras.layers.Concatenate(name="deep_features")([
        keras.layers.Embedding(num_users, embedding_dim, name="user_embedding")(user),
        keras.layers.Embedding(num_items, embedding_dim, name="item_embedding")(item),
        keras.layers.Embedding(NUM_SEGMENTS, 4, name="segment_embedding")(segment),
        keras.layers.Embedding(NUM_CATEGORIES, 8, name="category_embedding")(category),
        keras.layers.Embedding(24, 2, name="hour_embedding")(hour),
    ])
    x = keras.layers.Dense(64, activation="relu", name="deep_hidden1")(deep)
    x = keras.layers.Dense(32, activation="relu", name="deep_hidden2")(x)
    deep_logits = keras.layers.Dense(num_classes, name="deep_logits")(x)
    cross = segment * NUM_CATEGORIES + category
    wide_logits = keras.layers.Embedding(WIDE_BUCKETS, num_classes, name="wide_logits")(cross)
    logits = keras.layers.Add(name="logits")([deep_logits, wide_logits])
    return keras.Model(ids, logits, name="wide_and_deep")
