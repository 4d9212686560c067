"""Sweep analysis CLI: is this draft data-limited, or at a bottleneck? See draftlab/analysis/.

    python src/analyze.py <experiment name | parent run id> [--tracking-uri URI] [--out DIR] [--log-to-parent]
                          [--report docs/<name>.md] [--records FILE] [--allow-mixed-code]
"""

import sys

from draftlab.tracking.analyze import main

if __name__ == "__main__":
    sys.exit(main())
