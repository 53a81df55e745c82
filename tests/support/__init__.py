"""What every test tier shares, in one place (tests/unit/test_layers.py checks that no test
module outside it starts a server, builds a waker or a message, or picks a free port).

``services``   the machine's services (a missing one fails under CI=true, skips elsewhere),
               free loopback ports, and the servers a test owns: ``RedisServer`` (the one way
               a test starts ``redis-server``), ``Postgres``, ``RabbitServer``
``topology``   a Redis Cluster (with or without replicas) and a Sentinel group of ``RedisServer``
``proxies``    ``TcpProxy``: a loopback relay that holds replies, refuses, cuts or loses packets
``messages``   kombu messages as a broker delivers them to the gate, and the gate and waker
               built as the worker builds them (``make_waker`` is the one place a test builds
               a ``Waker``)
``waiting``    waiting on a condition (``wait_for``, ``wait_until``, ``spin`` for an event loop)
``fixtures``   the fixtures of every tier (a plugin of tests/conftest.py): services, servers of
               a test's own, ``make_harness`` and its projects
``harness``    real ``celery worker`` processes of one test (``Harness``), and ``gauge``, what
               their tasks measure themselves with; ``celery_command``, the command they run
``projects``   the Celery projects the harness runs (``create_app(env)`` each): ``base`` and
               the ``collapse``, ``slots``, ``fates``, ``differential`` and ``chaos`` variants
"""
