"""``python -m hybridpar.cli ...`` is the ``hybridpar`` command."""

from hybridpar.cli import main

main()
