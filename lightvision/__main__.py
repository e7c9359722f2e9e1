import sys

from lightvision.cli import main

sys.exit(main())
