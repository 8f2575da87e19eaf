import sys

from .cli import main

sys.exit(main(prog="python -m hybrid_ep_bench"))
