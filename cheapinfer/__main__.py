"""``python -m cheapinfer``: the suite's command line (:mod:`cheapinfer.cli`)."""
from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
