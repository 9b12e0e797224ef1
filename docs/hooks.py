"""MkDocs hooks: pages generated from the code, so they cannot drift from it.

- ``<!-- hybridpar:configuration -->`` becomes the configuration reference,
  read from the config sections (``hybridpar.config.reference``);
- ``<!-- hybridpar:cli NAME ARGS -->`` becomes the ``--help`` output of
  ``hybridpar NAME ARGS``, run in a child process;
- ``<!-- hybridpar:fixes -->`` becomes the table of every fix's record
  (``hybridpar.compat.fix_table``; importing ``hybridpar.compat`` loads TensorFlow,
  so only a page holding the marker pays for it).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

from hybridpar.config.reference import markdown_reference

CLI_MARKER = re.compile(r"<!-- hybridpar:cli ([\w -]+) -->")
FIXES_MARKER = "<!-- hybridpar:fixes -->"


def _cli_help(arguments: str) -> str:
    command = [sys.executable, "-m", "hybridpar.cli", *arguments.split(), "--help"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120,
                            env={"TF_CPP_MIN_LOG_LEVEL": "3", "PATH": ""}, check=False)
    if result.returncode != 0 or not result.stdout.strip():
        raise RuntimeError(f"{' '.join(command)} failed ({result.returncode}): {result.stderr}")
    return f"```text\n$ hybridpar {arguments} --help\n{result.stdout.rstrip()}\n```"


def on_page_markdown(markdown: str, **_: object) -> str:
    """Replaces the markers of generated content (MkDocs calls it for every page)."""
    markdown = markdown.replace("<!-- hybridpar:configuration -->", markdown_reference())
    if FIXES_MARKER in markdown:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # TensorFlow's import banner
        from hybridpar import compat
        from hybridpar.compat.fix_table import markdown_table

        markdown = markdown.replace(FIXES_MARKER, markdown_table(compat.known()))
    return CLI_MARKER.sub(lambda match: _cli_help(match.group(1)), markdown)
