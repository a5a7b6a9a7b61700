import sys

from pycollector.cli import main

sys.exit(main())
