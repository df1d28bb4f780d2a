"""k7async.server: a beanstalkd 1.12 server over a k7 job store (``k7core.jobs``).

    k7 serve /var/data/jobs --listen 127.0.0.1:11300 --fsync sync
    k7-beanstalkd -l 127.0.0.1 -p 11300 -b /var/data/jobs      # beanstalkd's own flags

or from code: ``await serve(ServerConfig(Path("/var/data/jobs")))``. Every existing beanstalkd
client works against it; docs/server.md has the compatibility table.
"""

from ._main import main as main
from ._server import Listen as Listen
from ._server import Server as Server
from ._server import ServerConfig as ServerConfig
from ._server import serve as serve

__all__ = ["Listen", "Server", "ServerConfig", "main", "serve"]

# Public objects report this package as their module (as k7core.jobs's do).
for _value in [globals()[name] for name in __all__]:
    if getattr(_value, "__module__", "").startswith(__name__ + "."):
        _value.__module__ = __name__
del _value
