"""``python3 -m gpuhub_notices``: the latest GPU guard notices, for ``gpu-info``; nothing at all
where there are none."""

from __future__ import annotations

import sys
import time

from .notices import format_notices, read_notices, recent


def main(argv: list[str]) -> int:
    if argv:
        print("usage: python3 -m gpuhub_notices", file=sys.stderr)
        return 2
    notices = read_notices()
    if notices:
        now = time.time()
        print("GPU guard notices (latest last):")
        print(format_notices(recent(notices, now), now))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
