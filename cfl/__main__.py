import sys

from cfl.cli import main

sys.exit(main())
