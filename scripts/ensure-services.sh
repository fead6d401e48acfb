#!/usr/bin/env bash
# Makes sure PostgreSQL (127.0.0.1:5432) and Redis (127.0.0.1:6379) answer; starts them if they are
# installed but stopped, and says what to install if they are missing. Also makes sure bubblewrap
# (the job sandbox of the workers the tests start) is installed: installed here when the package
# manager can, else it says what to install.
set -euo pipefail

PG_HOST=${ACE3_TEST_PG_HOST:-127.0.0.1}
PG_PORT=${ACE3_TEST_PG_PORT:-5432}
REDIS_PORT=${ACE3_TEST_REDIS_PORT:-6379}

pg_up() { pg_isready -q -h "$PG_HOST" -p "$PG_PORT" 2>/dev/null; }
redis_up() { redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else "$@"; fi; }

if ! command -v pg_isready >/dev/null || ! command -v redis-cli >/dev/null; then
  cat >&2 <<'MSG'
ace3: PostgreSQL and Redis are needed for the tests. Install them, for example:
  Debian/Ubuntu:  sudo apt-get install -y postgresql redis-server
  macOS:          brew install postgresql@15 redis && brew services start postgresql@15 && brew services start redis
Then allow local connections for the postgres user (trust, or set ACE3_TEST_DATABASE_ADMIN_URL).
MSG
  exit 1
fi

if ! pg_up; then
  echo "ace3: starting PostgreSQL"
  if command -v pg_ctlcluster >/dev/null && ls /etc/postgresql >/dev/null 2>&1; then
    for version in $(ls /etc/postgresql); do as_root pg_ctlcluster --skip-systemctl-redirect "$version" main start || true; done
  elif command -v brew >/dev/null; then
    brew services start postgresql@15 || true
  fi
  for _ in $(seq 1 30); do pg_up && break; sleep 1; done
  pg_up || { echo "ace3: PostgreSQL did not start on $PG_HOST:$PG_PORT" >&2; exit 1; }
fi

if ! redis_up; then
  echo "ace3: starting Redis"
  mkdir -p /tmp/ace3-redis
  redis-server --daemonize yes --bind 127.0.0.1 --port "$REDIS_PORT" --save "" --appendonly no \
    --dir /tmp/ace3-redis --logfile /tmp/ace3-redis/redis.log
  for _ in $(seq 1 30); do redis_up && break; sleep 0.5; done
  redis_up || { echo "ace3: Redis did not start on port $REDIS_PORT" >&2; exit 1; }
fi
echo "ace3: PostgreSQL and Redis are up"

if ! command -v bwrap >/dev/null; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "ace3: installing bubblewrap (the job sandbox)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; }
  fi
  if ! command -v bwrap >/dev/null; then
    cat >&2 <<'MSG'
ace3: the tests run jobs in the bubblewrap sandbox, which is not installed:
  Debian/Ubuntu:  sudo apt-get install -y bubblewrap      Fedora: sudo dnf install bubblewrap
MSG
    exit 1
  fi
fi
echo "ace3: bubblewrap $(bwrap --version | awk '{print $2}') is installed"
