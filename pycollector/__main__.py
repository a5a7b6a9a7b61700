import sys

from pycollector.launch import main

sys.exit(main())
