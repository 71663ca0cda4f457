import sys

from etweave.cli import main

sys.exit(main())
