"""CapsNet throughput benchmark (issue 2): a thin wrapper around capsnet.bench.

python benchmarks/throughput.py [--batch-sizes 32,128] [--rounds 5] [--quick]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from capsnet.bench import main

if __name__ == "__main__":
    sys.exit(main())
