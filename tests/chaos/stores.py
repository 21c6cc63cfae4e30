"""The stores of a chaos run: private instances the harness starts, breaks and restarts.

Never the machine's shared servers: each store here is a server of its own on a free port
(``redis-server``; a PostgreSQL cluster made with ``initdb`` and run with ``pg_ctl``; a
MariaDB made with ``mariadb-install-db`` and run with ``mariadbd``; a standalone ZooKeeper
run from Debian's jars by ``tests/support/zookeeper_server.py``), or a SQLite file, in
the run's work directory. As root, PostgreSQL runs as the user ``postgres`` and MariaDB as
``mysql``.

Each store knows the faults it can suffer (:attr:`Store.faults`) and injects them:
:meth:`Store.inject` returns when the store answers again.
"""

from __future__ import annotations

import contextlib
import glob
import ipaddress
import os
import pwd
import shutil
import signal
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from random import Random
from typing import Any

from tests.support.ports import free_port
from tests.support.redis_server import answers_ping

#: Seconds a server may take to answer after a start.
START_TIMEOUT = 60.0
#: The database the candidates use on a server.
DATABASE = "chaos"
#: The fenced writes, in commit order.
ROWS = "SELECT id, token, writer, note FROM demoapp_fencedwrite ORDER BY id"


def clock() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    give_up = clock() + timeout
    while not condition():
        if clock() > give_up:
            raise RuntimeError(f"{what}: no answer within {timeout:.0f} s")
        time.sleep(0.05)


class Injected:
    """What a store fault did: when it began, when the store answered again, and whether
    the store may have lost state (which allows the lock-delay)."""

    def __init__(self, start: float, ready: float, lossy: bool, detail: str = "") -> None:
        self.start, self.ready, self.lossy, self.detail = start, ready, lossy, detail


class Store:
    """A store the candidates share (see the subclasses)."""

    name = ""
    #: The store faults this store can suffer.
    faults: tuple[str, ...] = ()
    #: Whether lease.fenced() works here (a database store).
    fenced = True
    #: Whether the candidates reach it over a network (which a partition run cuts).
    networked = True
    #: Whether it may lose writes it acknowledged (see ``checker.Params.loses_writes``).
    loses_writes = False

    def __init__(self, workdir: Path, ttl: float) -> None:
        self.workdir = workdir
        self.ttl = ttl
        #: The address the candidates reach the server at; the harness always uses
        #: 127.0.0.1 (in a partition run: the loopback of the store's namespace).
        self.host = "127.0.0.1"

    def on_network(self, address: str) -> None:
        """Serve on ``address`` too (in a partition run: the store namespace's address, on
        which the candidates reach it; the server runs in that namespace)."""
        self.host = address

    @property
    def listen(self) -> list[str]:
        """The addresses the server listens on."""
        return sorted({"127.0.0.1", self.host})

    @classmethod
    def unavailable(cls) -> str | None:
        """Why this store cannot run on this machine, or None."""
        return None

    def start(self) -> None:
        """Start the private server and create the database."""

    def env(self) -> dict[str, str]:
        """The environment of a candidate process (testproject settings)."""
        raise NotImplementedError

    def inject(self, kind: str, rng: Random) -> Injected:
        raise NotImplementedError(kind)

    def rows(self) -> list[dict[str, Any]]:
        """The fenced writes, as ``row`` records for the checker."""
        return []

    def locks_held(self, pid: int) -> str:
        """The locks on the store that the stopped process ``pid`` keeps from every other
        process until it runs again ("" if none: a server ends a frozen client's locks on
        its own)."""
        return ""

    def stop(self) -> None:
        """Stop the private server."""

    def remove(self) -> None:
        """Remove the server's files kept outside the work directory."""
        base = getattr(self, "base", None)
        if base is not None:
            shutil.rmtree(base, ignore_errors=True)

    @staticmethod
    def _row(row: tuple[Any, ...]) -> dict[str, Any]:
        row_id, token, writer, note = row
        return {"ev": "row", "id": int(row_id), "token": int(token), "who": writer,
                "t": float(note)}  # fmt: skip


def sqlite_locks(path: Path, pid: int) -> str:
    """The POSIX locks (``READ``/``WRITE`` and byte range) that ``pid`` holds on the file
    ``path``, from the kernel's lock table (``/proc/locks``), comma-separated ("" if
    none)."""
    st = os.stat(path)
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    held = []
    for line in Path("/proc/locks").read_text().splitlines():
        # "1: POSIX  ADVISORY  WRITE 1234 00:2a:5678 1073741824 1073741824"
        fields = line.split()
        if "->" in fields:  # a waiter, not a holder
            continue
        mine = len(fields) >= 8 and fields[1] == "POSIX" and fields[4] == str(pid)
        if mine and fields[5] == inode:
            held.append(f"{fields[3]} {fields[6]}-{fields[7]}")
    return ", ".join(held)


def _as_user(user: str) -> list[str]:
    """The command prefix that runs a server as ``user`` when we are root."""
    return ["runuser", "-u", user, "--"] if os.geteuid() == 0 else []


def server_dir(kind: str, user: str) -> Path:
    """A new directory for a server's files, owned by ``user`` when we are root, in the
    system's temporary directory (the run's work directory may be closed to that user)."""
    path = Path(tempfile.mkdtemp(prefix=f"chaos-{kind}-"))
    path.chmod(0o755)
    if os.geteuid() == 0:
        entry = pwd.getpwnam(user)
        os.chown(path, entry.pw_uid, entry.pw_gid)
    return path


def _run(cmd: list[str], **options: Any) -> None:
    """Run a server tool; its error output in the exception if it fails."""
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          **options)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited with {done.returncode}: {done.stderr[-1500:]}")


def _down_for(rng: Random, ttl: float) -> float:
    """How long a restarted server stays down: sometimes shorter than the TTL (the leader
    may keep its lease), sometimes longer (it must step down)."""
    return rng.uniform(0.1, 1.5) * ttl


class SQLiteStore(Store):
    name = "sqlite"
    networked = False

    def __init__(self, workdir: Path, ttl: float) -> None:
        super().__init__(workdir, ttl)
        self.path = workdir / "chaos.sqlite3"

    def env(self) -> dict[str, str]:
        return {
            "DATABASE_URL": f"sqlite:///{self.path}",
            "DJANGO_LEADER_BACKEND": "django_leader.backends.db.DatabaseBackend",
            "DJANGO_LEADER_DATABASE": "default",
        }

    def rows(self) -> list[dict[str, Any]]:
        with sqlite3.connect(self.path, timeout=30) as db:
            found = db.execute(ROWS)
            return [self._row(row) for row in found]

    def locks_held(self, pid: int) -> str:
        """The POSIX locks ``pid`` holds on the database file (``/proc/locks``): SQLite's
        shared, reserved, pending or exclusive lock. Any of them keeps every other process
        from committing a write (a takeover included) in the default journal mode."""
        return sqlite_locks(self.path, pid)


class RedisStore(Store):
    """A private ``redis-server`` without automatic persistence; the history goes to a
    SQLite file. ``SAVE`` writes ``current.rdb``; a snapshot is a copy of it set aside."""

    name = "redis"
    faults = ("flush", "redis-restart-volatile", "redis-restart-persistent",
              "redis-restore-old", "conn-kill")  # fmt: skip
    fenced = False

    def __init__(self, workdir: Path, ttl: float) -> None:
        super().__init__(workdir, ttl)
        self.port = free_port()
        self.dir = workdir / "redis"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.history = workdir / "history.sqlite3"
        self.proc: subprocess.Popen[bytes] | None = None
        self.snapshot: Path | None = None

    @classmethod
    def unavailable(cls) -> str | None:
        if shutil.which("redis-server") is None:
            return "redis: redis-server is not installed"
        try:
            import redis  # noqa: F401
        except ImportError:
            return "redis: Python package 'redis' not installed"
        return None

    def client(self) -> Any:
        import redis

        return redis.Redis(port=self.port, socket_timeout=5, socket_connect_timeout=1)

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary is not None
        self.proc = subprocess.Popen(
            # Not protected mode: the candidates of a partition run connect from their
            # namespaces, over a network that exists only inside the run's namespaces.
            [binary, "--port", str(self.port), "--bind", *self.listen, "--protected-mode", "no",
             "--save", "",
             "--appendonly", "no", "--dir", str(self.dir), "--dbfilename", "current.rdb"],
            stdout=open(self.workdir / "redis.log", "ab"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        wait_until(self.answers, START_TIMEOUT, "redis-server")

    def answers(self) -> bool:
        return answers_ping(self.port)

    def env(self) -> dict[str, str]:
        return {
            "REDIS_URL": f"redis://{self.host}:{self.port}/0",
            "DATABASE_URL": f"sqlite:///{self.history}",
            "DJANGO_LEADER_BACKEND": "django_leader.backends.cache.CacheBackend",
            "DJANGO_LEADER_CACHE": "redis",
            "DJANGO_LEADER_DATABASE": "default",
        }

    def take_snapshot(self) -> None:
        """SAVE, and set the file aside: a later ``redis-restore-old`` starts from it."""
        self.client().save()
        self.snapshot = self.dir / "older.rdb"
        shutil.copyfile(self.dir / "current.rdb", self.snapshot)

    def _kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def inject(self, kind: str, rng: Random) -> Injected:
        start = clock()
        if kind == "flush":
            self.client().flushdb()
            return Injected(start, clock(), lossy=True)
        if kind == "conn-kill":
            killed = self.client().client_kill_filter(_type="normal", skipme=True)
            return Injected(start, clock(), lossy=False, detail=f"{killed} clients")
        if kind == "redis-restart-persistent":
            # SHUTDOWN SAVE: everything is on disk; the restart loses nothing. But nobody can
            # tell it from a restart from an older file (the next fault), so the lock-delay
            # is allowed: lossy for the liveness bound.
            # (the connection drops as the server exits)
            with contextlib.suppress(Exception):
                self.client().shutdown(save=True)
            assert self.proc is not None
            self.proc.wait()
            lossy = True
        else:
            self._kill()  # SIGKILL: a crash, nothing saved
            current = self.dir / "current.rdb"
            if kind == "redis-restart-volatile":
                current.unlink(missing_ok=True)
            elif kind == "redis-restore-old":
                assert self.snapshot is not None
                shutil.copyfile(self.snapshot, current)
            else:
                raise ValueError(kind)
            lossy = True
        down = _down_for(rng, self.ttl)
        time.sleep(down)
        self.start()
        return Injected(start, clock(), lossy=lossy, detail=f"down {down:.2f} s")

    def rows(self) -> list[dict[str, Any]]:
        return []

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self._kill()


class PostgreSQLStore(Store):
    """A private PostgreSQL cluster (``initdb``, ``pg_ctl``), ``fsync`` off (a restart is
    a crash of the server, not of the machine: nothing committed is lost)."""

    name = "postgresql"
    faults = ("pg-restart", "conn-kill")

    def __init__(self, workdir: Path, ttl: float) -> None:
        super().__init__(workdir, ttl)
        self.port = free_port()
        self.base = server_dir("pg", "postgres")
        self.data = self.base / "data"

    @staticmethod
    def bindir() -> str | None:
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        if found:
            return os.path.dirname(found[-1])
        initdb = shutil.which("initdb")
        return None if initdb is None else os.path.dirname(initdb)

    @classmethod
    def unavailable(cls) -> str | None:
        if cls.bindir() is None:
            return "postgresql: initdb is not installed (/usr/lib/postgresql/*/bin)"
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("postgres")
            except KeyError:
                return "postgresql: running as root, and there is no user 'postgres'"
        try:
            import psycopg  # noqa: F401
        except ImportError:
            return "postgresql: Python driver 'psycopg' not installed"
        return None

    def _pg(self, *args: str) -> None:
        _run([*_as_user("postgres"), *args], cwd="/")

    def start(self) -> None:
        bindir = self.bindir()
        assert bindir is not None
        if not self.data.exists():
            self._pg(f"{bindir}/initdb", "-D", str(self.data), "-U", "postgres",
                     "--auth=trust", "-E", "UTF8", "--no-sync")  # fmt: skip
            if self.host != "127.0.0.1":  # the candidates, from the run's namespaces
                subnet = ipaddress.ip_network(f"{self.host}/24", strict=False)
                with open(self.data / "pg_hba.conf", "a") as hba:
                    hba.write(f"host all all {subnet} trust\n")
            self._start()
            with self.connect("postgres") as db:
                db.execute(f"CREATE DATABASE {DATABASE}")
        else:
            self._start()

    def _start(self) -> None:
        options = (f"-p {self.port} -k {self.base} -c listen_addresses={','.join(self.listen)} "
                   "-c fsync=off -c max_connections=200")  # fmt: skip
        self._pg(f"{self.bindir()}/pg_ctl", "-D", str(self.data), "-o", options,
                 "-l", str(self.base / "server.log"), "-w", "-t", "60", "start")  # fmt: skip
        wait_until(self.answers, START_TIMEOUT, "postgresql")

    def connect(self, database: str = DATABASE) -> Any:
        import psycopg

        return psycopg.connect(host="127.0.0.1", port=self.port, user="postgres",
                               dbname=database, connect_timeout=2, autocommit=True)  # fmt: skip

    def answers(self) -> bool:
        try:
            with self.connect("postgres") as db:
                db.execute("SELECT 1")
            return True
        except Exception:
            return False

    def env(self) -> dict[str, str]:
        return {
            "DATABASE_URL": f"postgres://postgres@{self.host}:{self.port}/{DATABASE}",
            "DJANGO_LEADER_BACKEND": "django_leader.backends.db.DatabaseBackend",
            "DJANGO_LEADER_DATABASE": "default",
        }

    def inject(self, kind: str, rng: Random) -> Injected:
        start = clock()
        if kind == "conn-kill":
            with self.connect() as db:
                killed = db.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = %s AND pid <> pg_backend_pid()",
                    [DATABASE],
                ).fetchone()
            return Injected(start, clock(), lossy=False, detail=f"{killed[0]} connections")
        if kind != "pg-restart":
            raise ValueError(kind)
        self._pg(f"{self.bindir()}/pg_ctl", "-D", str(self.data), "-m", "immediate", "-w",
                 "stop")  # fmt: skip
        down = _down_for(rng, self.ttl)
        time.sleep(down)
        self._start()
        return Injected(start, clock(), lossy=False, detail=f"down {down:.2f} s")

    def rows(self) -> list[dict[str, Any]]:
        with self.connect() as db:
            found = db.execute(ROWS)
            return [self._row(row) for row in found.fetchall()]

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            subprocess.run(
                [*_as_user("postgres"), f"{self.bindir()}/pg_ctl", "-D", str(self.data),
                 "-m", "immediate", "-w", "stop"],
                cwd="/", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip


class MariaDBStore(Store):
    """A private MariaDB (``mariadb-install-db``, ``mariadbd``) with ``--skip-grant-tables``
    (only this run connects, on 127.0.0.1). A restart is a SIGKILL of the server: InnoDB
    recovers every committed transaction."""

    name = "mariadb"
    faults = ("mariadb-restart", "conn-kill")
    #: More ``mariadbd`` options (the TLS test's certificate and ``require-secure-transport``,
    #: which a server without grant tables does not enforce: with options, it has them).
    options: tuple[str, ...] = ()

    def __init__(self, workdir: Path, ttl: float) -> None:
        super().__init__(workdir, ttl)
        self.port = free_port()
        self.base = server_dir("mariadb", "mysql")
        self.data = self.base / "data"
        self.tmp = self.base / "tmp"
        self.proc: subprocess.Popen[bytes] | None = None

    @classmethod
    def unavailable(cls) -> str | None:
        for binary in ("mariadb-install-db", "mariadbd"):
            if shutil.which(binary) is None and not os.path.exists(f"/usr/sbin/{binary}"):
                return f"mariadb: {binary} is not installed"
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("mysql")
            except KeyError:
                return "mariadb: running as root, and there is no user 'mysql'"
        try:
            import MySQLdb  # noqa: F401
        except ImportError:
            return "mariadb: Python driver 'MySQLdb' not installed"
        return None

    def start(self) -> None:
        if not self.data.exists():
            user = ["--user=mysql"] if os.geteuid() == 0 else []
            # A temporary directory of its own: two servers bootstrapped at once in /tmp
            # (the TLS test beside a fenced-write test) tripped over each other's temporary
            # tables ("Error on delete of '/tmp/#sql-temptable-…'").
            self.tmp.mkdir(exist_ok=True)
            if os.geteuid() == 0:
                shutil.chown(self.tmp, "mysql")
            _run(["mariadb-install-db", "--no-defaults", *user, f"--datadir={self.data}",
                  f"--tmpdir={self.tmp}",
                  "--auth-root-authentication-method=normal", "--skip-test-db"],
                 cwd="/")  # fmt: skip
            self._start()
            with self.connect(None) as db:
                db.cursor().execute(f"CREATE DATABASE {DATABASE} CHARACTER SET utf8mb4")
        else:
            self._start()

    def _start(self) -> None:
        binary = shutil.which("mariadbd") or "/usr/sbin/mariadbd"
        user = ["--user=mysql"] if os.geteuid() == 0 else []
        self.proc = subprocess.Popen(
            [binary, "--no-defaults", *user, f"--datadir={self.data}", f"--port={self.port}",
             f"--tmpdir={self.tmp}",
             f"--bind-address={self._bind()}", f"--socket={self.base}/mysqld.sock",
             f"--pid-file={self.base}/mysqld.pid", *self._grants(), "--skip-log-bin",
             "--innodb-flush-log-at-trx-commit=2", "--innodb-buffer-pool-size=64M",
             "--max-connections=300", f"--log-error={self.base}/error.log", *self.options],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_until(self.answers, START_TIMEOUT, "mariadbd")

    def _grants(self) -> list[str]:
        return [] if self.options else ["--skip-grant-tables"]

    def _bind(self) -> str:
        # One address, or every address: on a network, those of the store's namespace
        # only (its loopback and its own eth0).
        return "127.0.0.1" if self.host == "127.0.0.1" else "0.0.0.0"

    def connect(self, database: str | None = DATABASE) -> Any:
        import MySQLdb

        extra: dict[str, Any] = {} if database is None else {"database": database}
        if self.options:
            extra["ssl_mode"] = "REQUIRED"
        return MySQLdb.connect(host="127.0.0.1", port=self.port, user="root",
                               connect_timeout=2, autocommit=True, **extra)  # fmt: skip

    def answers(self) -> bool:
        try:
            db = self.connect(None)
            db.close()
            return True
        except Exception:
            return False

    def env(self) -> dict[str, str]:
        return {
            "DATABASE_URL": f"mysql://root@{self.host}:{self.port}/{DATABASE}",
            "DJANGO_LEADER_BACKEND": "django_leader.backends.db.DatabaseBackend",
            "DJANGO_LEADER_DATABASE": "default",
        }

    def inject(self, kind: str, rng: Random) -> Injected:
        start = clock()
        if kind == "conn-kill":
            db = self.connect()
            try:
                cursor = db.cursor()
                cursor.execute(
                    "SELECT id FROM information_schema.processlist "
                    "WHERE id <> CONNECTION_ID() AND db = %s",
                    [DATABASE],
                )
                ids = [row[0] for row in cursor.fetchall()]
                killed = 0
                for connection_id in ids:
                    with contextlib.suppress(Exception):  # it may have ended meanwhile
                        cursor.execute(f"KILL CONNECTION {int(connection_id)}")
                        killed += 1
            finally:
                db.close()
            return Injected(start, clock(), lossy=False, detail=f"{killed} connections")
        if kind != "mariadb-restart":
            raise ValueError(kind)
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        down = _down_for(rng, self.ttl)
        time.sleep(down)
        self._start()
        return Injected(start, clock(), lossy=False, detail=f"down {down:.2f} s")

    def rows(self) -> list[dict[str, Any]]:
        db = self.connect()
        try:
            cursor = db.cursor()
            cursor.execute(ROWS)
            return [self._row(row) for row in cursor.fetchall()]
        finally:
            db.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class ZooKeeperStore(Store):
    """A private standalone ZooKeeper (:class:`tests.support.zookeeper_server.ZooKeeperServer`)
    with a 200 ms tick, so that it grants sessions as short as the TTL (the candidates ask
    for LEASE_TTL); the history goes to a SQLite file.

    Besides the faults aimed at the leader (a SIGSTOP of 1.2-2 TTLs outlasts its session,
    which ends and takes its lease node with it), the server's own:

    ``conn-drop``
        every client connection to the server aborted on the clients' side (``ss -K``);
        they reconnect within their session timeout and keep their sessions. Without
        ``ss -K``, a SIGSTOP of the server for 0.3 TTL.
    ``zk-pause``
        SIGSTOP of the server for 0.1-1.5 TTLs, then SIGCONT: sessions whose timeout ran
        out meanwhile end as it resumes.
    ``zk-restart``
        SIGKILL of the server (a crash: its transaction log holds every acknowledged
        write), down 0.1-1.5 TTLs, started again with its data: sessions live on.
    ``zk-wipe``
        SIGKILL, its data directory deleted, down 0.1-1.5 TTLs, started empty: a lost
        store, so nobody may take the lease for the lock-delay and tokens continue from the
        clock (lossy). The emptied server refuses a client that saw a later transaction
        than its own: the backend connects again as a new client after a refused
        handshake (tests/processes/test_chaos.py).
    """

    name = "zookeeper"
    faults = ("conn-drop", "zk-pause", "zk-restart", "zk-wipe")
    fenced = False
    #: The candidates' root on the server.
    ROOT = "/chaos"

    def __init__(self, workdir: Path, ttl: float) -> None:
        super().__init__(workdir, ttl)
        self.history = workdir / "history.sqlite3"
        self.server: Any = None

    @classmethod
    def unavailable(cls) -> str | None:
        from tests.support.zookeeper_server import missing

        reason = missing()
        if reason is not None:
            return f"zookeeper: {reason}"
        try:
            import kazoo  # noqa: F401
        except ImportError:
            return "zookeeper: Python package 'kazoo' not installed"
        return None

    def start(self) -> None:
        from tests.support.zookeeper_server import ZooKeeperServer

        if self.server is None:
            self.server = ZooKeeperServer(self.workdir, tick_ms=200)
            if self.host != "127.0.0.1":  # every address of the store's namespace
                config = self.server.node.config_file
                config.write_text(config.read_text().replace(
                    "clientPortAddress=127.0.0.1", "clientPortAddress=0.0.0.0"))  # fmt: skip
        self.server.start()

    def env(self) -> dict[str, str]:
        assert self.server is not None
        return {
            "DJANGO_SETTINGS_MODULE": "tests.chaos.settings",
            "CHAOS_ZOOKEEPER_HOSTS": f"{self.host}:{self.server.port}",
            "CHAOS_ZOOKEEPER_ROOT": self.ROOT,
            "DATABASE_URL": f"sqlite:///{self.history}",
            "DJANGO_LEADER_BACKEND": "django_leader.backends.zookeeper.ZooKeeperBackend",
            "DJANGO_LEADER_DATABASE": "default",
        }

    def _drop_connections(self) -> int | None:
        """Abort every client socket connected to the server (``ss -K``); how many, or
        None if ``ss`` cannot (not installed, or a kernel without socket destruction)."""
        if shutil.which("ss") is None:
            return None
        # The clients' sockets; on a network, the server's (the clients are in namespaces
        # of their own: the server's end aborts, and they get a reset).
        port = f":{self.server.port}"
        ends = (["dst", "127.0.0.1", "dport", "=", port] if self.host == "127.0.0.1"
                else ["src", self.host, "sport", "=", port])  # fmt: skip
        done = subprocess.run(["ss", "-K", "-t", "-n", "state", "established", *ends],
                              capture_output=True, text=True)  # fmt: skip
        lines = [line for line in done.stdout.splitlines()[1:] if line.strip()]
        return len(lines) if done.returncode == 0 else None

    def _pause(self, seconds: float) -> None:
        self.server.pause()
        try:
            time.sleep(seconds)
        finally:
            self.server.resume()
        self.server.wait_serving()

    def inject(self, kind: str, rng: Random) -> Injected:
        start = clock()
        if kind == "conn-drop":
            dropped = self._drop_connections()
            if dropped is None:
                self._pause(0.3 * self.ttl)
                return Injected(start, clock(), lossy=False, detail="paused (no ss -K)")
            return Injected(start, clock(), lossy=False, detail=f"{dropped} connections")
        if kind == "zk-pause":
            paused = rng.uniform(0.1, 1.5) * self.ttl
            self._pause(paused)
            return Injected(start, clock(), lossy=False, detail=f"paused {paused:.2f} s")
        if kind not in ("zk-restart", "zk-wipe"):
            raise ValueError(kind)
        self.server.kill()
        if kind == "zk-wipe":
            self.server.wipe()
        down = _down_for(rng, self.ttl)
        time.sleep(down)
        self.server.start()
        return Injected(start, clock(), lossy=kind == "zk-wipe", detail=f"down {down:.2f} s")

    def stop(self) -> None:
        if self.server is not None:
            self.server.close()


#: --store name -> class (``mysql`` is MariaDB too).
STORES: dict[str, type[Store]] = {
    "sqlite": SQLiteStore,
    "postgresql": PostgreSQLStore,
    "mariadb": MariaDBStore,
    "mysql": MariaDBStore,
    "redis": RedisStore,
    "zookeeper": ZooKeeperStore,
}

# The replicated stores build on Store (so they come after it).
from tests.chaos.replicated import (  # noqa: E402
    ClusterStore,
    PooledStore,
    SentinelStore,
    StandbyStore,
    SyncStandbyStore,
)

STORES.update(
    {
        "redis-sentinel": SentinelStore,
        "redis-cluster": ClusterStore,
        "postgresql-standby": StandbyStore,
        "postgresql-sync": SyncStandbyStore,
        "postgresql-pgbouncer": PooledStore,
    }
)
