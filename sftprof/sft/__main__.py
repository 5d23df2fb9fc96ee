import sys

from sftprof.sft import main

sys.exit(main())
