"""Every limit in one place, units last in names.

These are defaults; servers and clients take overrides through their constructors or CLI
flags. Nothing in tectofs queues, buffers or retries without one of these bounding it.
"""

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

# Data model
block_size_default_bytes = 64 * MiB
block_size_max_bytes = 64 * MiB
block_size_min_bytes = 64 * KiB
checksum_piece_bytes = 64 * KiB          # crc32c granularity inside a chunk
name_length_max_bytes = 255
path_length_max_bytes = 16 * KiB          # an absolute path; the kernel's PATH_MAX (4096) bounds a path
                                          # relative to a working directory, which may be deep already
symlink_target_max_bytes = 4096
link_count_max = 65_000                   # names of one file (ext4's limit); more is EMLINK
xattr_name_max_bytes = 255                # an extended attribute's name, namespace included (XATTR_NAME_MAX)
xattr_value_max_bytes = 64 * KiB          # one value (XATTR_SIZE_MAX)
xattr_names_max_bytes = 64 * KiB          # all names of one file, NUL-separated (XATTR_LIST_MAX)
int64_max = 2**63 - 1                     # inode numbers, sizes, offsets, ids: what SQL BIGINT holds
owner_id_max = 2**32 - 2                  # uid/gid (2**32 - 1 is "no owner" to the kernel)
timestamp_abs_max_s = 1e11                # times are finite and within ~3,000 years of 1970
policy_width_max = 48                     # chunks of one block: rs(32,16)
inline_bytes_default = 64 * KiB           # files up to this size live in the metadata store (tectofs meta --inline-max)
inline_bytes_max = 256 * KiB              # the most --inline-max may be (one frame header carries a file's data)
create_xattrs_max = 4                     # xattrs a create carrying a file's content sets (4 x 64K + 256K of data fit a frame header)

# Wire protocol
frame_header_max_bytes = 1 * MiB          # msgpack header of one frame
frame_payload_max_bytes = block_size_max_bytes + 1 * MiB
rpc_timeout_s = 60.0
rpc_connect_timeout_s = 5.0
rpc_retries_max = 4
rpc_backoff_initial_s = 0.05
rpc_backoff_max_s = 2.0
connections_per_server = 2
hello_timeout_s = 3.0                     # a client waits this long for the answer to its hello
hello_retries_max = 1                     # further connection attempts after a hello went unanswered
hello_wait_server_s = 10.0                # a server closes a connection whose hello (and auth) is not done by then
                                          # (a 512-rank burst's clients, busy encoding, took over 2 s)
reply_header_budget_bytes = 768 * KiB     # what a listing or layout reply fills, under frame_header_max_bytes
message_text_max_bytes = 4096             # free-text fields (reasons, versions)
peer_log_lines_per_s = 20                 # log lines a peer can provoke (invalid requests, bad-chunk reports), per kind
address_length_max_bytes = 255            # "HOST:PORT" of a server
listen_backlog_max = 4096                 # a checkpoint burst connects thousands of clients at once
local_socket_buffer_bytes = 4 << 20       # SO_SNDBUF/SO_RCVBUF of local (Unix) connections (tectofs.wire.local_sockets)
frame_receive_first_bytes = 4 * KiB       # first piece a header is received into (pieces grow with what arrived)
frame_payload_amplification_max = 64      # a (deferred) payload buffer is made once 1/64 of the payload arrived
frame_payload_staged_min_bytes = 4 * KiB  # ... and at least this much of it (all of a smaller one)
frame_drain_scratch_bytes = 256 * KiB     # one buffer per process that refused payloads are drained into
frame_stall_timeout_s = 30.0              # a server closes a connection whose begun frame got no byte this long
frame_receive_rate_min_bytes_per_s = 1 * MiB  # ... or not done by the stall timeout + its size at this rate
frame_progress_window_s = 5.0             # ... or that got less than this window's worth of bytes at
frame_progress_min_bytes_per_s = 256 * KiB  # ... this rate over its last window (a trickle holds nothing long)
connection_idle_timeout_s = 600.0         # ... and one with no frame and no request in flight this long
connections_max = 65536                   # connections one server process keeps (24k ranks, 2 connections each, fit)
connections_per_peer_max = 2048           # ... from one peer IP address (a node of many ranks, a gateway)
anonymous_connections_max = 1024          # unauthenticated connections a metadata service keeps (oldest evicted)
connections_reserved = 1024               # ... places of a metadata service users never take: root's and its servers'
eviction_scan_max = 256                   # connections looked at for the longest idle one, when one must go
connection_refused_linger_s = 1.0         # a connection over a cap waits this long (at most) to be told why
connections_refused_lingering_max = 1024  # ... at most this many at once (beyond: closed at once)
file_descriptors_reserved = 256           # descriptors a server keeps for its own files, outside connections_max

# Chunk server
chunk_inflight_bytes_max = 512 * MiB      # admission: above this new puts are answered BUSY
chunk_inflight_alone_fraction = 0.75      # ... of it one principal may hold alone; with n holding, 1/n each
chunk_pack_max_bytes_default = 1 * MiB    # chunk servers pack chunks up to this size into segment files (0: off; --pack-max);
                                          # larger ones (a 4 MiB block's under rs(4,2): 1 MiB + 160 B) get files (O_DIRECT, sendfile)
chunk_pack_max_bytes_max = 4 * MiB        # the largest --pack-max (bigger chunks gain nothing from packing)
chunk_sendfile_min_bytes = 1 * MiB        # chunk reads at least this big are sent from the file (sendfile), unread here
send_file_regions_max = 16                # file regions open for sending per process (more: read and sent as usual)
send_file_stall_s = 30.0                  # sending a file region may take this long ...
send_file_rate_min_bytes_per_s = 1 * MiB  # ... plus its bytes at this rate; a slower peer is dropped
send_buffer_threads = 8                   # threads that send large payloads from memory, per process
send_on_thread_min_bytes = 1 * MiB        # payloads from memory this large go out on those threads (not TLS)
chunk_direct_io_min_bytes = 1 * MiB       # chunk files at least this big are written with O_DIRECT (if aligned)
chunk_pack_segment_bytes = 256 * MiB      # a packed-chunk segment file grows to this, then a new one starts
chunk_pack_compact_interval_s = 60.0      # how often a chunk server looks for mostly dead segments to compact
heartbeat_interval_s = 1.0
server_dead_after_s = 5.0
heartbeats_outstanding_max = 3
restart_backoff_max_s = 30.0              # tectofs up: longest wait before restarting a child that died

# Metadata service
group_commit_batch_max = 256              # operations folded into one store transaction
store_retries_max = 12                    # runs of a transaction the database aborted as retryable
meta_queue_max = 20_000                  # operations waiting for the store before BUSY answers
allocation_grace_s = 600.0                # uncommitted blocks older than this are garbage
reader_lease_s = 60.0                     # an open reader's hold on its file's chunks, renewed while open
lease_release_delay_s = 0.2               # a closed handle's lease ends within this (closes are batched)
leases_per_release_max = 512              # leases ended by one "release_leases" call
gc_orders_per_heartbeat_max = 1024
readdir_page_entries_max = 2000           # entries of one readdir reply (fewer if the byte budget is reached)
allocate_blocks_max = 1024                # block ids one allocate call reserves
commit_blocks_max = 1024                  # blocks (and holes) one commit or stage call carries
servers_max = 1024                        # chunk servers one metadata service registers (one servers reply)

# Self-healing (repair, scrub, inventory)
repair_after_s = 600.0                    # a server dead this long has its chunks rebuilt elsewhere (Ceph's down-out)
repair_interval_s = 2.0                   # how often the metadata service looks for chunks to rebuild
repair_concurrency_per_server = 2         # rebuilds one chunk server runs at once
repair_concurrency_per_server_max = 256   # ... at most (--repair-concurrency)
repair_rate_bytes_per_s = 64 * MiB        # bytes a chunk server fetches for rebuilds per second
repair_busy_rate_bytes_per_s = 16 * MiB   # ... while clients have writes in flight on it
repair_timeout_s = 120.0                  # an order not reported done by then is given to another server
repair_unreported_max = 4096              # rebuild outcomes a chunk server keeps to resend while the MDS is away
repair_orders_per_heartbeat_max = 16       # (each names up to 48 sources: the reply stays bounded)
repair_scheduled_per_round_max = 4096     # rebuilds one scheduling round queues
repair_candidates_per_round_max = 50_000  # troubled blocks one scheduling round looks at
scrub_rate_bytes_per_s = 4 * MiB          # background checksum verification, per chunk server (HDFS: 1 MB/s)
scrub_pass_interval_s = 3600.0            # a scrub pass starts at most this often (a small store is not re-read in a loop)
scrub_busy_pause_s = 0.2                  # the scrubber waits while clients have chunk writes in flight
inventory_interval_s = 3600.0             # full chunk reports after the one at start
inventory_batch_max = 5000                # block ids in one inventory request
orphan_grace_s = 600.0                    # an unreferenced chunk is collected this long after a report found it
health_inos_per_call_max = 1000           # files one block_health (fsck) call covers

server_gc_gen0_allocations = 50_000       # servers' youngest-generation collection threshold (Python: 700)

# Client
write_inflight_bytes_max = 256 * MiB      # block bytes being encoded/sent at once per open file
write_blocks_inflight_range = (2, 8)      # ... as a number of blocks, whatever the block size
read_prefetch_blocks = 1
partial_read_max_bytes = 1 * MiB          # a read of at most this much of a 4x larger block fetches only its bytes
partial_read_timeout_s = 2.0              # ... else (slower, or a chunk unreadable) the whole block is read
unlink_batch_max = 1000                   # names one unlink_many call removes (one transaction)
read_inflight_bytes_max = 64 * MiB       # whole blocks one read call fetches at once, in bytes ...
read_blocks_parallel_range = (4, 32)      # ... as a number of blocks, whatever the block size
client_buffer_pool_bytes = 1 * GiB        # idle buffers kept for reuse, per process
client_codec_threads = 2                  # encode/decode/checksum threads, per process
staging_timeout_s = 300.0                 # async_save waits at most this long for the previous upload
interrupt_unwind_s = 30.0                 # a Ctrl-C waits this long for the interrupted call to unwind
spare_servers_per_block = 2               # extra placements handed out for hedged writes
hedge_after_min_s = 1.0                   # never hedge a chunk put younger than this
hedge_slowdown_factor = 4.0               # hedge when a put runs this many times the median of its block
hedge_check_interval_s = 0.25
server_down_memo_s = 10.0                 # a client reads around a chunk server it failed to reach for this long
placement_attempts_max = 3                # fresh placements asked for one block before NoSpace

# Failover and exactly-once
address_group_members_max = 16            # servers one address group ("HOST:PORT,HOST:PORT") names
request_dedupe_retention_s = 600.0        # a non-idempotent call's recorded reply is kept this long for its retries
request_dedupe_prune_interval_s = 60.0    # how often a metadata service deletes older records

# Command line (tectofs/cli/numbers.py): the largest values options take, beyond anything meaningful
option_seconds_max = 10 * 365 * 86400.0   # a duration (--heartbeat, --timeout, --older-than ...): ten years
option_rate_mib_per_s_max = 1024.0 * 1024  # a rate (--scrub-rate, --repair-rate): 1 TiB/s, past any disk or NIC

# Security (tectofs/wire/auth.py)
capability_ttl_s = 3600.0                 # a layout's or allocation's chunk capabilities are valid this long
ticket_ttl_s = 3600.0                     # a ticket (an identity for memory agents) is valid this long
ticket_renew_s = 600.0                    # a client takes a fresh ticket once its own has less than this left
ticket_expiry_step_s = 600.0              # tickets expire on multiples of this: one identity's are alike meanwhile
users_max = 100_000                       # users one cluster keeps (tectofs user add)
acting_views_max = 256                    # local users a multi-user mount keeps a metadata connection for
user_cache_s = 5.0                        # a metadata service reuses a user's lookup for its hellos this long
user_cache_entries_max = 10_000
fuse_caller_cache_s = 1.0                 # a mount re-reads a calling process's supplementary groups after this
fuse_caller_cache_entries_max = 4096      # calling processes a mount remembers (forgotten all at once past it)
fuse_caller_groups_max = 256              # supplementary groups an act_as hello carries (messages.ActAs)

# Metadata leases (server/meta/leases.py, client/lease_session.py)
lease_s = 30.0                            # a lease session's life after its last keepalive arrived
lease_keepalive_wait_s = 10.0             # longest a keepalive is held waiting for a recall
lease_inodes_per_session_max = 1_000_000  # inodes one session holds (past that its oldest are recalled)
lease_sessions_max = 100_000              # sessions one metadata service keeps at a time
lease_recalls_per_reply_max = 16          # recalls one keepalive answer carries (the rest: the next one)
lease_recall_keys_max = 128               # names, inodes and listings one recall names (more: several recalls)
lease_remote_changes_kept = 100_000       # peers' recalls remembered for reads that raced them
metadata_cache_entries_max = 1_000_000     # names (and as many inodes) a leasing client keeps cached
metadata_cache_data_bytes_max = 64 * MiB  # small files' bytes (inline layouts) a leasing client keeps cached
metadata_cache_chunk_layouts_max = 4096    # larger files' layouts a leasing client keeps, each with a parked reader's lease
# Asynchronous creates (client/claims.py, server/meta/leases.py): a client that creates a burst of
# files in one directory claims it exclusively and creates there with no call, in batches.
claim_after_creates = 3                    # creates in one directory (each one call) before the client claims it
claim_inodes = 256                         # inode numbers one claim hands the client at most (a new claim when used)
claim_inodes_first = 32                    # ... the first claim of a directory (each next one twice the last)
claim_backoff_s = 1.0                      # after its claim was recalled, a client creates there by calls this long
create_batch_max = 256                     # creates one "create_many" call makes (one transaction)
create_batch_bytes_max = 512 * KiB         # small files' bytes one "create_many" call carries (their first commits)
background_commit_bytes_max = 8 * MiB     # small files' bytes a mount holds unsent before a close waits for them
create_flush_delay_s = 0.05                # an unflushed create reaches the service within this
claim_retries_max = 64                     # times one call waits for a claim's recall and runs again
