"""Example models for hybridpar (installed as ``hybridpar_models``)."""
