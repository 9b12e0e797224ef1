"""``python -m hybridpar.launch ...`` is ``hybridpar launch ...``."""

import sys

from hybridpar.launch.args import main

sys.exit(main(sys.argv[1:]))
