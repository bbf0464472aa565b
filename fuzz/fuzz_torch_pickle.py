"""atheris target: the static pickle walker alone (data.pkl and legacy pickles)."""

from __future__ import annotations

from harness import main, pickle_target

if __name__ == "__main__":
    main(pickle_target)
