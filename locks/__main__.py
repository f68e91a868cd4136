import sys

from locks.cli import main

sys.exit(main())
