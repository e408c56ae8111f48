"""python -m bench.report"""

import sys

from bench.report import main

sys.exit(main())
