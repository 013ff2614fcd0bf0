"""The tables of the metadata store (see ``engine.py`` for what each holds) and the columns
added since the first release, which ``SqlStore`` adds to an older store when it opens it.
SQL in the subset SQLite and PostgreSQL share."""

SCHEMA = [
    """CREATE TABLE IF NOT EXISTS inodes (
        ino BIGINT PRIMARY KEY, kind TEXT NOT NULL, mode INTEGER NOT NULL,
        uid BIGINT NOT NULL, gid BIGINT NOT NULL, size BIGINT NOT NULL DEFAULT 0,
        atime DOUBLE PRECISION NOT NULL, mtime DOUBLE PRECISION NOT NULL, ctime DOUBLE PRECISION NOT NULL,
        nlink INTEGER NOT NULL DEFAULT 1, policy TEXT NOT NULL, block_size BIGINT NOT NULL,
        target TEXT, parent BIGINT NOT NULL, stored BIGINT NOT NULL DEFAULT 0,
        write_min INTEGER NOT NULL DEFAULT 0)""",
    """CREATE TABLE IF NOT EXISTS names (
        parent BIGINT NOT NULL, name TEXT NOT NULL, ino BIGINT NOT NULL, PRIMARY KEY (parent, name))""",
    """CREATE TABLE IF NOT EXISTS blocks (
        ino BIGINT NOT NULL, idx BIGINT NOT NULL, block_id BIGINT NOT NULL, policy TEXT NOT NULL,
        length BIGINT NOT NULL, valid BIGINT NOT NULL, start BIGINT NOT NULL DEFAULT 0,
        missing INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (ino, idx))""",
    """CREATE TABLE IF NOT EXISTS chunks (
        block_id BIGINT NOT NULL, position INTEGER NOT NULL, server_id INTEGER NOT NULL,
        length BIGINT NOT NULL, crc BIGINT NOT NULL, PRIMARY KEY (block_id, position))""",
    """CREATE TABLE IF NOT EXISTS allocations (
        block_id BIGINT PRIMARY KEY, ino BIGINT NOT NULL, created DOUBLE PRECISION NOT NULL,
        servers TEXT NOT NULL, writer BIGINT NOT NULL DEFAULT 0)""",
    """CREATE TABLE IF NOT EXISTS servers (
        server_id INTEGER PRIMARY KEY, uuid TEXT UNIQUE NOT NULL, address TEXT NOT NULL,
        capacity BIGINT NOT NULL DEFAULT 0, used BIGINT NOT NULL DEFAULT 0,
        inflight BIGINT NOT NULL DEFAULT 0, chunks BIGINT NOT NULL DEFAULT 0,
        last_heartbeat DOUBLE PRECISION NOT NULL, registered DOUBLE PRECISION NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS gc_queue (
        server_id INTEGER NOT NULL, block_id BIGINT NOT NULL, due DOUBLE PRECISION NOT NULL,
        ino BIGINT NOT NULL DEFAULT 0, PRIMARY KEY (server_id, block_id))""",
    # Blocks stored inline (a small file's block 0): its bytes in the store instead of chunks;
    # like a blocks row otherwise (start, length, valid). A file has a block at an index in
    # blocks or here, never both.
    """CREATE TABLE IF NOT EXISTS inline_blocks (
        ino BIGINT NOT NULL, idx BIGINT NOT NULL, start BIGINT NOT NULL, length BIGINT NOT NULL,
        valid BIGINT NOT NULL, data BYTEA NOT NULL, crc BIGINT NOT NULL, PRIMARY KEY (ino, idx))""",
    # Directories lease sessions hold claimed (server/meta/claims.py): a row per range of inode
    # numbers handed out, so a service that restarts takes back the holder's creates in its grace period.
    """CREATE TABLE IF NOT EXISTS claims (
        first BIGINT PRIMARY KEY, count BIGINT NOT NULL, directory BIGINT NOT NULL, session BYTEA NOT NULL)""",
    # Readers' leases: while one is live, the chunks of the file's dropped blocks are kept (an
    # unlinked or replaced file stays readable through the handles that have it open).
    """CREATE TABLE IF NOT EXISTS read_leases (
        ino BIGINT NOT NULL, reader BIGINT NOT NULL, expires DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (ino, reader))""",
    # files with no name left, kept while a handle holds them (engine.collect_orphans)
    "CREATE INDEX IF NOT EXISTS inodes_unlinked ON inodes (ino) WHERE nlink = 0",
    """CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value BIGINT NOT NULL)""",
    # Parts of a commit sent ahead by a writer (``stage``): a block (its descriptor as JSON) or
    # a hole (block_id NULL) per index, invisible until that writer's commit publishes them.
    """CREATE TABLE IF NOT EXISTS staged (
        ino BIGINT NOT NULL, writer BIGINT NOT NULL, idx BIGINT NOT NULL, block_id BIGINT,
        block TEXT, created DOUBLE PRECISION NOT NULL, PRIMARY KEY (ino, writer, idx))""",
    # Users (``users.py``): root is implicit, not stored. uid, gid: BIGINT, as limits.owner_id_max
    # (2**32 - 2) outgrows PostgreSQL's INTEGER. groups: a JSON list of gids; secret: hex.
    """CREATE TABLE IF NOT EXISTS users (
        name TEXT PRIMARY KEY, uid BIGINT NOT NULL, gid BIGINT NOT NULL, groups TEXT NOT NULL,
        secret TEXT NOT NULL, admin INTEGER NOT NULL DEFAULT 0, proxy INTEGER NOT NULL DEFAULT 0,
        s3_access_key TEXT UNIQUE, s3_secret TEXT, created DOUBLE PRECISION NOT NULL)""",
]

# Columns added after the first release: (table, column, declaration, fill-in for existing rows).
ADDED_COLUMNS = [
    ("blocks", "start", "start BIGINT NOT NULL DEFAULT 0", None),
    ("allocations", "writer", "writer BIGINT NOT NULL DEFAULT 0", None),
    ("inodes", "write_min", "write_min INTEGER NOT NULL DEFAULT 0", None),
    ("gc_queue", "ino", "ino BIGINT NOT NULL DEFAULT 0", None),
    # chunks a degraded write could not store: the block is under-redundant until repaired
    ("blocks", "missing", "missing INTEGER NOT NULL DEFAULT 0", None),
    ("inodes", "rdev", "rdev BIGINT NOT NULL DEFAULT 0", None),  # device number of a char or block node
    ("inodes", "stored", "stored BIGINT NOT NULL DEFAULT 0",
     "UPDATE inodes SET stored = (SELECT COALESCE(SUM(valid - start), 0) FROM blocks WHERE blocks.ino = inodes.ino)"),
    # a chunk server's Prometheus URL (NULL: off); filled in by the next heartbeat of a running server
    ("servers", "metrics_url", "metrics_url TEXT", None),
    # how many extended attributes the inode has: a client holding its attributes answers
    # "none" to the kernel's probes (security.selinux at ls -l, security.capability at writes) itself
    ("inodes", "xattrs", "xattrs INTEGER NOT NULL DEFAULT 0",
     "UPDATE inodes SET xattrs = (SELECT COUNT(*) FROM xattrs WHERE xattrs.ino = inodes.ino)"),
]

# Columns widened since the first release, on PostgreSQL (SQLite's integers are 64-bit
# already): uids and gids up to 2**32 - 2 do not fit a PostgreSQL INTEGER.
WIDENED_COLUMNS_POSTGRESQL = [("inodes", "uid", "BIGINT"), ("inodes", "gid", "BIGINT")]
