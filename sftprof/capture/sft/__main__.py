import sys

from sftprof.capture.sft import main

sys.exit(main())
