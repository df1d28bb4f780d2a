"""``python -m k7async.server``: the same as ``k7-beanstalkd``."""

from . import main

main()
