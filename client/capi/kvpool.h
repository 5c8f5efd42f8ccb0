/* kvpool.h: the C API of libkvpool, for FFI (Python ctypes/cffi, Rust, Go).
 *
 * The same calls as client/connection/connection.h. Every function returns KVPOOL_OK (0) or an
 * error code (the values of kvpool::Errc in common/status.h); kvpool_last_error() gives the message
 * that names the cause. Out-arrays are caller-allocated and must hold the counts stated.
 * A kvpool_conn is used by one thread at a time. Memory: page p of the pool is at
 * (char*)kvpool_base(c) + p * info.page_stride: host memory when info.device < 0, else device
 * memory on CUDA device info.device (an ordinal of this process).
 * Elastic pools grow and shrink at run time (client/connection/connection.h): every call follows
 * a change the daemon announced before it returns, and kvpool_poll_notices() does so without a
 * request.
 * kvpool_base() never changes; pages of a removed segment (none this connection holds) must not
 * be touched after the call that followed the shrink.
 */
#ifndef KVPOOL_CLIENT_KVPOOL_H_
#define KVPOOL_CLIENT_KVPOOL_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVPOOL_OK 0

typedef struct kvpool_conn kvpool_conn;
typedef uint32_t kvpool_page_id;

typedef struct {
  uint64_t lo;
  uint64_t hi;
} kvpool_hash;

typedef struct {
  kvpool_page_id page;
  kvpool_hash hash;
} kvpool_publish_item;

typedef struct {
  uint8_t duplicate;   /* 0: stored on the given page; 1: another page already had the hash */
  kvpool_page_id page; /* stored: the given page; duplicate: the existing page, now held */
} kvpool_publish_result;

typedef struct {
  uint32_t layers;
  uint32_t kv_heads;
  uint32_t head_dim;
  uint32_t tokens_per_page;
  uint8_t dtype; /* 0 fp16, 1 bf16, 2 fp8_e4m3, 3 int8 */
  uint32_t num_pages;
  uint64_t page_stride;
  uint64_t segment_bytes;
  int32_t device;        /* CUDA ordinal in this process holding the pool; -1: host memory */
  uint8_t layout;        /* 0 page_major, 1 layer_major */
  uint64_t layer_stride; /* bytes from layer l to l+1 in layer_major, 0 otherwise */
  /* Elastic pools (fields are only ever appended here). num_pages is the pool's size as this
   * connection last synced it; max_pages is the most it may grow to (num_pages for a fixed
   * pool); epoch counts its grows and shrinks; reserved_bytes is the virtual range at
   * kvpool_base() kept for it (segment_bytes of it are mapped now). */
  uint32_t max_pages;
  uint32_t epoch;
  uint64_t reserved_bytes;
  /* A segmented layer_major pool (an elastic one): segments of segment_pages pages,
   * segment_stride bytes apart, each laid out layer_major with planes of segment_pages pages
   * (layer_stride is inside a segment); both 0 otherwise. kvpool_block_index() gives a page's
   * place in a per-layer tensor of blocks. */
  uint32_t segment_pages;
  uint64_t segment_stride;
} kvpool_pool_info;

typedef struct {
  uint32_t total, free, in_use, cached, sessions;
  uint64_t lookups, lookup_blocks, hit_blocks, allocated, released, published, duplicates, evicted,
      flushed;
  uint32_t session_held_pages;
} kvpool_stats;

/* Eviction hints (common/types.h PageHints), applied to every later alloc, retain, lookup and
 * publish of this connection until changed: the pages those calls leave it holding get the
 * priority class (the highest any call gave a page counts) and, when pin_ttl_ms > 0, a pin that
 * keeps them cached that long (bounded by the daemon per tenant: limits.max_pin_ttl_ms and
 * limits.max_pinned_pages_per_tenant). */
#define KVPOOL_PRIORITY_NONE 0
#define KVPOOL_PRIORITY_ONE_OFF 1
#define KVPOOL_PRIORITY_CONVERSATION 2
#define KVPOOL_PRIORITY_SYSTEM 3
typedef struct {
  uint8_t priority; /* KVPOOL_PRIORITY_* */
  uint32_t pin_ttl_ms;
} kvpool_hints;

/* Connects and attaches to pool_name (NULL or "" = the daemon's default pool). socket_path NULL
 * = $KVPOOL_SOCKET, else the daemon's default path. On failure *out is NULL and the message is
 * copied into err (if err_len > 0). */
int kvpool_attach(const char* socket_path, const char* worker_name, const char* pool_name,
                  kvpool_conn** out, char* err, size_t err_len);
/* kvpool_attach with options (NULL: none, as kvpool_attach):
 *   link         another group of a hybrid model this process attached (its first group): the
 *                new session joins link's, so a lookup_groups on either answers for both;
 *   hash_scheme  how this worker names blocks, which the pool's pools[].hash_scheme must match
 *                (the daemon refuses another, naming both): KVPOOL_HASH_SCHEME_KVPOOL, the
 *                kvpool_hash_* functions' (kvpool_attach's), or KVPOOL_HASH_SCHEME_VLLM,
 *                kvpool_vllm_hash_*'s. */
#define KVPOOL_HASH_SCHEME_KVPOOL 0
#define KVPOOL_HASH_SCHEME_VLLM 1
typedef struct {
  const kvpool_conn* link;
  uint8_t hash_scheme;
} kvpool_attach_options;
int kvpool_attach_ex(const char* socket_path, const char* worker_name, const char* pool_name,
                     const kvpool_attach_options* options, kvpool_conn** out, char* err,
                     size_t err_len);
/* Closes the connection; the daemon releases every page it still held. */
void kvpool_detach(kvpool_conn* c);
const char* kvpool_last_error(const kvpool_conn* c);

void* kvpool_base(const kvpool_conn* c);
void kvpool_get_pool_info(const kvpool_conn* c, kvpool_pool_info* out);
/* Where page `page` sits in a per-layer tensor of blocks: layer l's K plane viewed from
 * kvpool_base(c) + l * layer_stride in blocks of tokens_per_page * kv_heads * head_dim elements
 * (V: a further segment_pages blocks, or num_pages in an unsegmented pool). The page itself
 * except in a segmented layer_major pool: (page / segment_pages) * (segment_stride / block
 * bytes) + page % segment_pages. What block tables handed to an engine's own kernels hold. */
uint64_t kvpool_block_index(const kvpool_conn* c, kvpool_page_id page);
/* The attention kind of the pool's geometry (KVPOOL_ATTENTION_FULL, _SLIDING, _CHUNKED or
 * _LATENT) and its window in tokens (0 for full and latent): what kvpool_hash_root_attention needs
 * to name the pool's blocks as every other worker of the pool does. Either pointer may be NULL. */
void kvpool_get_pool_attention(const kvpool_conn* c, uint8_t* kind, uint32_t* window);

/* NULL = no hints. An unknown priority is refused (invalid_argument) and changes nothing. */
int kvpool_set_hints(kvpool_conn* c, const kvpool_hints* hints);
int kvpool_alloc(kvpool_conn* c, uint32_t n, kvpool_page_id* out /* n */);
int kvpool_retain(kvpool_conn* c, const kvpool_page_id* pages, size_t n);
int kvpool_release(kvpool_conn* c, const kvpool_page_id* pages, size_t n);
/* *hits pages of the longest cached prefix of chain, each now held, into out (room for n). On a
 * sliding or chunked pool the prefix may skip blocks that no query resuming after it reads (those
 * before the window of its last block): their entries are KVPOOL_NO_PAGE, and hold nothing. Such
 * a hit of *hits blocks serves a sequence resuming at token *hits · tokens_per_page exactly; one
 * resuming earlier must look up the shorter chain. */
#define KVPOOL_NO_PAGE 0xFFFFFFFFu
int kvpool_lookup(kvpool_conn* c, const kvpool_hash* chain, size_t n, kvpool_page_id* out,
                  uint32_t* hits);
/* The same, and tiers[i] (room for n) says which tier served hit i: KVPOOL_TIER_DEVICE,
 * KVPOOL_TIER_HOST for a block the daemon promoted from the pool's host tier into out[i], or
 * KVPOOL_TIER_CONVERTED for one it converted back into out[i] from the 8-bit pool the pool's
 * evictions go to (convert_evictions_to; its values carry 8-bit precision), KVPOOL_TIER_REMOTE
 * for one it fetched into out[i] from the pool's remote tier on Redis Cluster (remote_tier). */
#define KVPOOL_TIER_DEVICE 0
#define KVPOOL_TIER_HOST 1
#define KVPOOL_TIER_CONVERTED 2
#define KVPOOL_TIER_REMOTE 3
#define KVPOOL_TIER_NONE 255 /* a KVPOOL_NO_PAGE entry */
int kvpool_lookup_with_tiers(kvpool_conn* c, const kvpool_hash* chain, size_t n,
                             kvpool_page_id* out, uint8_t* tiers, uint32_t* hits);
int kvpool_publish(kvpool_conn* c, const kvpool_publish_item* items, size_t n,
                   kvpool_publish_result* out /* n */);
/* What a router needs to know of a publish's blocks (the pool's KV events carry it: BlockStored's
 * parent_block_hash, token_ids and lora_name). The items are consecutive blocks of one sequence;
 * parent is item 0's parent block (NULL: item 0 is the sequence's first block); token_ids holds
 * tokens_per_page ids per item (NULL with n_token_ids 0: none); lora_name names the adapter the
 * blocks were computed with (NULL or "": none; at most 256 bytes). */
typedef struct {
  const kvpool_hash* parent;
  const uint32_t* token_ids;
  size_t n_token_ids;
  const char* lora_name;
} kvpool_block_chain;
/* kvpool_publish with the blocks' chain (NULL: as kvpool_publish). Token ids that do not fill the
 * blocks (n_token_ids other than n · tokens_per_page) are refused (invalid_argument) before
 * anything is sent. */
int kvpool_publish_chain(kvpool_conn* c, const kvpool_publish_item* items, size_t n,
                         const kvpool_block_chain* chain, kvpool_publish_result* out /* n */);
/* The daemon copies pages src[i] -> dst[i] (all layers and scales): pages this session holds,
 * destinations not published, no page both read and written. Returns when the copy is done. */
int kvpool_copy(kvpool_conn* c, const kvpool_page_id* src, const kvpool_page_id* dst, size_t n);
int kvpool_get_stats(kvpool_conn* c, kvpool_stats* out);
/* Every counter of the pool (the pool counter table, common/stats_counters.h: lookups,
 * hit_blocks, pins, host_demoted, ...), by position: kvpool_counter_count() of them, the name of
 * the i-th (NULL past the end). kvpool_get_counters asks the daemon and writes up to n values in
 * that order into values (NULL only when n is 0); *written (when not NULL) is how many it wrote:
 * fewer when the daemon's table is shorter than n, 0 on an error. */
size_t kvpool_counter_count(void);
const char* kvpool_counter_name(size_t i);
int kvpool_get_counters(kvpool_conn* c, uint64_t* values, size_t n, size_t* written);
/* The daemon's own figures (the daemon counter table: sessions, events_lost, reloads,
 * sessions_refused, ...), by position, as the pool's counters above. */
size_t kvpool_daemon_counter_count(void);
const char* kvpool_daemon_counter_name(size_t i);
int kvpool_get_daemon_counters(kvpool_conn* c, uint64_t* values, size_t n, size_t* written);

/* Elastic pools. Without blocking, reads the pool-changed notices already waiting and maps (or
 * unmaps) the pool's new segments; *changed (may be NULL) = 1 when the mapping changed, else 0.
 * For an idle worker, so that a shrink's memory is released without waiting for its next call. */
int kvpool_poll_notices(kvpool_conn* c, int* changed);
/* Admin: resizes an elastic pool by whole segments within its min and max: below `pages` it
 * grows to the first size at or above it, above it shrinks while it stays at or above it;
 * *now (may be NULL) = its size in pages after the call (this connection follows it). */
int kvpool_resize(kvpool_conn* c, uint32_t pages, uint32_t* now);

/* Hybrid models (kvpoold's pools[].groups: one pool per KV group, MODEL/GROUP, one budget). A
 * worker attaches one session per group, each joining the first (kvpool_attach_ex with
 * options.link), and one kvpool_lookup_groups answers the prefix every group can serve.
 * kvpool_model_name is "" and kvpool_num_groups 0 on a plain pool; kvpool_group is this
 * session's group, kvpool_group_name the name of group g (NULL past the end), the pool of group g
 * being "<model>/<name>". The strings stay valid until kvpool_detach. */
const char* kvpool_model_name(const kvpool_conn* c);
uint32_t kvpool_num_groups(const kvpool_conn* c);
uint32_t kvpool_group(const kvpool_conn* c);
const char* kvpool_group_name(const kvpool_conn* c, uint32_t g);
uint64_t kvpool_session_id(const kvpool_conn* c);
/* The longest prefix of chain every group can serve: *hits blocks; out (room for
 * kvpool_num_groups · n, group-major: group g's page of block i at out[g · n + i]; entries from
 * hits to n − 1 are left as they were) gets each group's pages, held by that group's session,
 * KVPOOL_NO_PAGE where a group's window does not need the block. The session must be linked to
 * every group's. A group's pool is elastic: a page at or past its connection's num_pages
 * (kvpool_get_pool_info) is in a segment that connection has not mapped yet; kvpool_sync_pool
 * on it maps it before the page is touched. */
int kvpool_lookup_groups(kvpool_conn* c, const kvpool_hash* chain, size_t n, kvpool_page_id* out,
                         uint32_t* hits);

/* Asks the daemon for the pool's segments and maps the new ones now (one round trip); *changed
 * (may be NULL) = 1 when the mapping changed. For a page another session's reply named. */
int kvpool_sync_pool(kvpool_conn* c, int* changed);

/* Static reservations: the pages of a sequence of up to max_tokens, held at once, its block
 * table fixed (kvpool_release refuses them) until kvpool_unreserve or the session's end. seeds
 * (pages this session holds, a lookup's hit; may be NULL with n_seeds 0) come first, a sliding
 * group's KVPOOL_NO_PAGE entries staying KVPOOL_NO_PAGE in the table. table needs
 * room for ceil(max_tokens / tokens_per_page) pages (*written = that count); a smaller table is
 * refused before anything is reserved. Counts against the session's and tenant's quota. */
int kvpool_reserve(kvpool_conn* c, uint32_t max_tokens, const kvpool_page_id* seeds, size_t n_seeds,
                   uint64_t* reservation, kvpool_page_id* table, size_t table_len, size_t* written);
int kvpool_unreserve(kvpool_conn* c, uint64_t reservation);

/* The name of an error code ("out_of_pages", ...); "unknown_error" for a value that is none. */
const char* kvpool_error_name(int code);

/* Block hashing, exactly as kvpool's own workers hash (common/block_hash.h), so a worker in any
 * language names blocks as every other worker of the pool does: SHA-256 truncated to 128 bits,
 * chained from a root that names the model, its geometry, adapter and salt. Thread-safe (each
 * thread hashes with its own context). On failure the functions return an error code and
 * kvpool_hash_last_error() (this thread's) names the cause. */
typedef struct {
  uint32_t layers;
  uint32_t kv_heads;
  uint32_t head_dim;
  uint32_t tokens_per_page;
  uint8_t dtype; /* 0 fp16, 1 bf16, 2 fp8_e4m3, 3 int8 */
} kvpool_geometry;

/* The root of a model's chains. adapter_id and salt may be NULL (none). */
int kvpool_hash_root(const char* model_id, const kvpool_geometry* geometry, const char* adapter_id,
                     const char* salt, kvpool_hash* out);
/* Attention kinds of a pool's geometry (its config's geometry.kind): every earlier token, the last
 * `window` tokens, the tokens of the current chunk of `window`, or an MLA cache (one vector of
 * head_dim values per token and layer, kv_heads 1, no V). */
#define KVPOOL_ATTENTION_FULL 0
#define KVPOOL_ATTENTION_SLIDING 1
#define KVPOOL_ATTENTION_CHUNKED 2
#define KVPOOL_ATTENTION_LATENT 3
/* The root of the chains of a pool whose geometry has attention kind `kind` and `window` tokens
 * (0 for full): the kind and window are part of the root, so a sliding pool's blocks are never
 * named like a full one's. With KVPOOL_ATTENTION_FULL and 0 it equals kvpool_hash_root. */
int kvpool_hash_root_attention(const char* model_id, const kvpool_geometry* geometry, uint8_t kind,
                               uint32_t window, const char* adapter_id, const char* salt,
                               kvpool_hash* out);
/* The hash of one block of n tokens given its parent (the root for block 0); extra keys
 * (multimodal content hashes, ...) may be NULL with extra_len 0. */
int kvpool_hash_block(const kvpool_hash* parent, const uint32_t* tokens, size_t n,
                      const void* extra, size_t extra_len, kvpool_hash* out);
/* The hashes of every full block of tokens_per_block tokens, chained from root, into out (room
 * for out_len); *written = how many. A trailing partial block is never hashed. */
int kvpool_hash_chain(const kvpool_hash* root, const uint32_t* tokens, size_t n,
                      uint32_t tokens_per_block, kvpool_hash* out, size_t out_len, size_t* written);
const char* kvpool_hash_last_error(void);

/* vLLM's block hash (docs/BLOCK_HASH.md, "vLLM's scheme"), for a pool whose hash_scheme is
 * vllm-sha256-cbor/1: digests of 32 bytes, chained from the seed's NONE_HASH; a pool key is
 * kvpool_vllm_key of a digest (its low word is vLLM's integer event hash). Thread-safe as the
 * kvpool_hash_* functions. */
/* NONE_HASH of `seed` (the engines' PYTHONHASHSEED): the parent of a sequence's first block. */
int kvpool_vllm_none_hash(const char* seed, uint8_t out[32]);
/* The digest of one full block of n tokens under `parent` (a digest, or NONE_HASH); extra_cbor is
 * the block's extra keys as one CBOR item (vLLM's tuple, deterministic encoding), NULL with
 * extra_len 0 for None. */
int kvpool_vllm_hash_block(const uint8_t parent[32], const uint32_t* tokens, size_t n,
                           const void* extra_cbor, size_t extra_len, uint8_t out[32]);
void kvpool_vllm_key(const uint8_t digest[32], kvpool_hash* out);

#ifdef __cplusplus
}
#endif

#endif /* KVPOOL_CLIENT_KVPOOL_H_ */
