/*
 * warren-lazyfs: a read-only FUSE file system whose files are layer blobs held by an
 * OCI registry, fetched chunk by chunk with HTTP Range requests when they are read.
 *
 * A node mounts a layer it has not downloaded as a file-backed EROFS mount whose
 * backing file is <mountpoint>/<hex> here, so the kernel reads only the blocks a
 * sandbox touches, and each of those reads becomes (at most) one chunk fetch.
 *
 *   warren-lazyfs MOUNTPOINT --desc DIR --cache DIR --cache-bytes N [--pid-file F]
 *
 * DIR/<hex>.desc describes one blob (written by the node before it mounts the layer;
 * read here on the first lookup of <hex>):
 *   url <blob URL>            size <bytes>            chunk <chunk size>
 *   auth <Authorization header value>   (optional)
 *   cainfo <CA bundle path>             (optional)
 * and DIR/<hex>.chunks holds the sha256 of every chunk, 32 bytes each, in order.
 *
 * Every chunk is checked against its digest before a single byte of it is served:
 * a chunk that does not match (a corrupt registry blob, a truncated answer) fails
 * the read with EIO and is logged; wrong bytes never reach the reader.
 *
 * Verified chunks are kept in a node-local cache (CACHE/<hex>/<index>), bounded to
 * --cache-bytes and evicted least recently used first. The cache survives restarts
 * of this daemon; a cached chunk is checked again the first time it is served by a
 * new daemon, so a damaged cache file is fetched again rather than served.
 *
 * <mountpoint>/.stats is a JSON document of counters (fetches, bytes fetched, cache
 * hits, verification failures, cache size) for the node and its benchmarks.
 *
 * Single-threaded on purpose: the state is one LRU and a few counters, and the
 * registry round trip dominates a miss anyway.
 */
#define FUSE_USE_VERSION 31
#define _GNU_SOURCE
#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <inttypes.h>
#include <openssl/evp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define MAX_CHUNK (16u << 20)
/* Sequential misses fetch growing runs of chunks in one request, up to this many bytes:
 * a file read front to back costs a few round trips instead of one per chunk. */
#define MAX_RUN_BYTES (1u << 20)
#define MAX_LAYERS 4096

struct centry {
  struct centry *prev, *next; /* LRU: head = most recent */
  struct layer *layer;
  uint32_t index;
  uint32_t size;
};

struct layer {
  char hex[65];
  char *url, *auth, *cainfo;
  uint64_t size;
  uint32_t chunk, nchunks;
  unsigned char *digests;    /* 32 * nchunks */
  unsigned char *verified;   /* per chunk: cache file checked by this daemon */
  struct centry **entries;   /* per chunk: cache entry or NULL */
  time_t *bad;               /* per chunk: when it last failed verification (0: never) */
  uint64_t fetched_bytes, fetches, hits;
  uint32_t next_seq;         /* the chunk after the last fetched range (sequential detection) */
  uint32_t window;           /* chunks per fetch while reads are sequential */
};

static struct {
  const char *desc, *cache, *pidfile;
  uint64_t cache_limit, cache_bytes;
  struct layer *layers[MAX_LAYERS];
  int nlayers;
  struct centry *head, *tail;
  uint64_t fetches, fetched_bytes, hits, verify_failures, fetch_errors, evictions;
  CURL *curl;
  unsigned char *buf; /* one chunk */
  unsigned char *run; /* a run of chunks being fetched */
} g;

static void logf_(const char *fmt, ...) {
  char ts[32];
  time_t t = time(NULL);
  struct tm tm;
  gmtime_r(&t, &tm);
  strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", &tm);
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "%s warren-lazyfs: ", ts);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

static int is_hex64(const char *s) {
  if (strlen(s) != 64) return 0;
  for (int i = 0; i < 64; i++)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
  return 1;
}

static void sha256(const unsigned char *p, size_t n, unsigned char out[32]) {
  unsigned int len = 32;
  EVP_Digest(p, n, out, &len, EVP_sha256(), NULL);
}

static void hex_of(const unsigned char *d, char out[65]) {
  for (int i = 0; i < 32; i++) sprintf(out + 2 * i, "%02x", d[i]);
  out[64] = 0;
}

/* ------------------------------------------------------------------ LRU */

static void lru_unlink(struct centry *e) {
  if (e->prev) e->prev->next = e->next; else g.head = e->next;
  if (e->next) e->next->prev = e->prev; else g.tail = e->prev;
  e->prev = e->next = NULL;
}

static void lru_push_front(struct centry *e) {
  e->prev = NULL;
  e->next = g.head;
  if (g.head) g.head->prev = e;
  g.head = e;
  if (!g.tail) g.tail = e;
}

static void cache_path(const struct layer *l, uint32_t idx, char *out, size_t n) {
  snprintf(out, n, "%s/%s/%" PRIu32, g.cache, l->hex, idx);
}

static void cache_drop(struct centry *e) {
  char p[4096];
  cache_path(e->layer, e->index, p, sizeof p);
  unlink(p);
  lru_unlink(e);
  e->layer->entries[e->index] = NULL;
  e->layer->verified[e->index] = 0;
  g.cache_bytes -= e->size;
  free(e);
}

static void evict_until(uint64_t room) {
  while (g.tail && g.cache_bytes + room > g.cache_limit) {
    g.evictions++;
    cache_drop(g.tail);
  }
}

static void cache_add(struct layer *l, uint32_t idx, uint32_t size, int verified) {
  struct centry *e = calloc(1, sizeof *e);
  if (!e) return;
  e->layer = l;
  e->index = idx;
  e->size = size;
  l->entries[idx] = e;
  l->verified[idx] = verified;
  g.cache_bytes += size;
  lru_push_front(e);
}

/* Keep a verified chunk: written to a temporary file and renamed, so a crash never
 * leaves a partial chunk under its final name. Skipped when it cannot fit at all. */
static void cache_store(struct layer *l, uint32_t idx, const unsigned char *data, uint32_t size) {
  if (size > g.cache_limit) return;
  evict_until(size);
  char dir[4096], p[4096], tmp[4200];
  snprintf(dir, sizeof dir, "%s/%s", g.cache, l->hex);
  mkdir(dir, 0700);
  cache_path(l, idx, p, sizeof p);
  snprintf(tmp, sizeof tmp, "%s.tmp", p);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return;
  size_t off = 0;
  while (off < size) {
    ssize_t w = write(fd, data + off, size - off);
    if (w <= 0) { close(fd); unlink(tmp); return; }
    off += (size_t)w;
  }
  close(fd);
  if (rename(tmp, p) != 0) { unlink(tmp); return; }
  cache_add(l, idx, size, 1);
}

/* ------------------------------------------------------------- layers */

static char *dupstr(const char *s) {
  size_t n = strlen(s);
  while (n > 0 && (s[n - 1] == '\n' || s[n - 1] == '\r')) n--;
  char *d = malloc(n + 1);
  if (d) { memcpy(d, s, n); d[n] = 0; }
  return d;
}

static void layer_free(struct layer *l) {
  if (!l) return;
  free(l->url); free(l->auth); free(l->cainfo); free(l->digests); free(l->verified); free(l->entries); free(l->bad); free(l);
}

static struct layer *layer_find(const char *hex) {
  for (int i = 0; i < g.nlayers; i++)
    if (strcmp(g.layers[i]->hex, hex) == 0) return g.layers[i];
  return NULL;
}

/* Load DIR/<hex>.desc and DIR/<hex>.chunks; NULL (logged) when either is missing or inconsistent. */
static struct layer *layer_load(const char *hex, int quiet) {
  struct layer *l = layer_find(hex);
  if (l) return l;
  if (g.nlayers >= MAX_LAYERS) return NULL;
  char p[4096];
  snprintf(p, sizeof p, "%s/%s.desc", g.desc, hex);
  FILE *f = fopen(p, "re");
  if (!f) {
    if (!quiet) logf_("no descriptor for %s", hex);
    return NULL;
  }
  l = calloc(1, sizeof *l);
  if (!l) { fclose(f); return NULL; }
  memcpy(l->hex, hex, 65);
  char line[8192];
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "url ", 4) == 0) { free(l->url); l->url = dupstr(line + 4); }
    else if (strncmp(line, "auth ", 5) == 0) { free(l->auth); l->auth = dupstr(line + 5); }
    else if (strncmp(line, "cainfo ", 7) == 0) { free(l->cainfo); l->cainfo = dupstr(line + 7); }
    else if (strncmp(line, "size ", 5) == 0) l->size = strtoull(line + 5, NULL, 10);
    else if (strncmp(line, "chunk ", 6) == 0) l->chunk = (uint32_t)strtoul(line + 6, NULL, 10);
  }
  fclose(f);
  if (!l->url || l->chunk < 4096 || l->chunk > MAX_CHUNK || l->size == 0) {
    logf_("descriptor of %s is incomplete", hex);
    layer_free(l);
    return NULL;
  }
  uint64_t n = (l->size + l->chunk - 1) / l->chunk;
  if (n > UINT32_MAX) { layer_free(l); return NULL; }
  l->nchunks = (uint32_t)n;
  l->digests = malloc((size_t)n * 32);
  l->verified = calloc(n, 1);
  l->entries = calloc(n, sizeof *l->entries);
  l->bad = calloc(n, sizeof *l->bad);
  if (!l->digests || !l->verified || !l->entries || !l->bad) { layer_free(l); return NULL; }
  snprintf(p, sizeof p, "%s/%s.chunks", g.desc, hex);
  int fd = open(p, O_RDONLY | O_CLOEXEC);
  ssize_t got = fd < 0 ? -1 : read(fd, l->digests, (size_t)n * 32);
  if (fd >= 0) {
    char extra;
    if (got == (ssize_t)(n * 32) && read(fd, &extra, 1) != 0) got = -1;
    close(fd);
  }
  if (got != (ssize_t)(n * 32)) {
    logf_("chunk index of %s is missing or does not have %" PRIu64 " digests", hex, n);
    layer_free(l);
    return NULL;
  }
  g.layers[g.nlayers++] = l;
  return l;
}

/* ---------------------------------------------------------------- fetch */

struct sink { unsigned char *buf; size_t len, cap; };

static size_t on_body(char *p, size_t sz, size_t nm, void *ud) {
  struct sink *s = ud;
  size_t n = sz * nm;
  /* An answer longer than the range asked for (a server that ignores Range and sends
   * the whole blob) is cut off here instead of being downloaded. */
  if (s->len + n > s->cap) return 0;
  memcpy(s->buf + s->len, p, n);
  s->len += n;
  return n;
}

static int fetch_range(struct layer *l, uint64_t off, uint32_t len, unsigned char *out) {
  for (int attempt = 0; attempt < 3; attempt++) {
    if (attempt > 0) usleep(100000u << (2 * (attempt - 1)));
    CURL *c = g.curl;
    curl_easy_reset(c);
    char range[64];
    snprintf(range, sizeof range, "%" PRIu64 "-%" PRIu64, off, off + len - 1);
    struct sink s = { out, 0, len };
    struct curl_slist *h = NULL;
    char hdr[8300];
    if (l->auth) {
      snprintf(hdr, sizeof hdr, "Authorization: %s", l->auth);
      h = curl_slist_append(h, hdr);
    }
    curl_easy_setopt(c, CURLOPT_URL, l->url);
    curl_easy_setopt(c, CURLOPT_RANGE, range);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &s);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, 5L);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 5L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 30L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    if (l->cainfo) curl_easy_setopt(c, CURLOPT_CAINFO, l->cainfo);
    if (h) curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    CURLcode rc = curl_easy_perform(c);
    long code = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    curl_slist_free_all(h);
    g.fetches++;
    l->fetches++;
    g.fetched_bytes += s.len;
    l->fetched_bytes += s.len;
    if (rc == CURLE_OK && code == 206 && s.len == len) return 0;
    if (rc == CURLE_OK && code == 200 && off == 0 && len == l->size && s.len == len) return 0;
    g.fetch_errors++;
    if (rc == CURLE_WRITE_ERROR || (rc == CURLE_OK && code == 200)) {
      logf_("%s: the registry ignored the Range request (HTTP %ld): refusing to download the whole blob", l->hex, code);
      return -EIO;
    }
    if (rc == CURLE_OK && code >= 400 && code < 500 && code != 429) {
      logf_("%s: bytes %s: HTTP %ld from %s", l->hex, range, code, l->url);
      return -EIO;
    }
    logf_("%s: bytes %s: %s (HTTP %ld, %zu of %u bytes)%s", l->hex, range, rc == CURLE_OK ? "short answer" : curl_easy_strerror(rc), code, s.len, len,
          attempt < 2 ? ", retrying" : "");
  }
  return -EIO;
}

static uint32_t chunk_len(const struct layer *l, uint32_t idx) {
  uint64_t off = (uint64_t)idx * l->chunk;
  return (uint32_t)((l->size - off) < l->chunk ? (l->size - off) : l->chunk);
}

/* Chunk `idx` of `l` into g.buf, verified. Returns its length or -EIO.
 * `want` = how many chunks from idx on the current read needs. */
static int get_chunk(struct layer *l, uint32_t idx, uint32_t want) {
  uint64_t off = (uint64_t)idx * l->chunk;
  uint32_t len = (uint32_t)((l->size - off) < l->chunk ? (l->size - off) : l->chunk);
  unsigned char d[32];
  struct centry *e = l->entries[idx];
  if (e) {
    char p[4096];
    cache_path(l, idx, p, sizeof p);
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    ssize_t got = -1;
    if (fd >= 0) {
      got = pread(fd, g.buf, len, 0);
      close(fd);
    }
    int ok = got == (ssize_t)len && e->size == len;
    if (ok && !l->verified[idx]) {
      sha256(g.buf, len, d);
      ok = memcmp(d, l->digests + 32 * (size_t)idx, 32) == 0;
      if (ok) l->verified[idx] = 1;
      else logf_("%s: cached chunk %u is damaged; fetching it again", l->hex, idx);
    }
    if (ok) {
      g.hits++;
      l->hits++;
      lru_unlink(e);
      lru_push_front(e);
      return (int)len;
    }
    cache_drop(e);
  }
  /* The kernel retries a failed readahead page by page: a chunk that just failed
   * verification fails again at once instead of being fetched once per page. */
  if (l->bad[idx] && time(NULL) - l->bad[idx] < 10) return -EIO;
  /* How many chunks to fetch: what this read needs, or more while misses are sequential;
   * never past a chunk already cached or one that just failed. */
  if (idx == l->next_seq && idx != 0) l->window = l->window ? l->window * 2 : 2;
  else l->window = 1;
  uint32_t max_run = MAX_RUN_BYTES / l->chunk ? MAX_RUN_BYTES / l->chunk : 1;
  if (l->window > max_run) l->window = max_run;
  uint32_t n = want > l->window ? want : l->window;
  if (n > max_run) n = max_run;
  uint32_t k = 1;
  while (k < n && idx + k < l->nchunks && !l->entries[idx + k] && !l->bad[idx + k]) k++;
  if (k > 1) {
    uint64_t run_len = 0;
    for (uint32_t i = 0; i < k; i++) run_len += chunk_len(l, idx + i);
    int r = fetch_range(l, off, (uint32_t)run_len, g.run);
    if (r < 0) return r;
    l->next_seq = idx + k;
    int result = -EIO;
    uint64_t pos = 0;
    for (uint32_t i = 0; i < k; i++) {
      uint32_t cl = chunk_len(l, idx + i);
      sha256(g.run + pos, cl, d);
      if (memcmp(d, l->digests + 32 * (size_t)(idx + i), 32) != 0) {
        char want_hex[65], got_hex[65];
        hex_of(l->digests + 32 * (size_t)(idx + i), want_hex);
        hex_of(d, got_hex);
        g.verify_failures++;
        l->bad[idx + i] = time(NULL);
        logf_("%s: chunk %u (bytes %" PRIu64 "-%" PRIu64 ") fails verification: sha256 %s, expected %s; the registry's blob is corrupt", l->hex, idx + i,
              (uint64_t)(idx + i) * l->chunk, (uint64_t)(idx + i) * l->chunk + cl - 1, got_hex, want_hex);
      } else {
        if (i == 0) {
          memcpy(g.buf, g.run, cl);
          result = (int)cl;
        }
        cache_store(l, idx + i, g.run + pos, cl);
      }
      pos += cl;
    }
    return result;
  }
  int r = fetch_range(l, off, len, g.buf);
  if (r < 0) return r;
  l->next_seq = idx + 1;
  sha256(g.buf, len, d);
  if (memcmp(d, l->digests + 32 * (size_t)idx, 32) != 0) {
    char want[65], got[65];
    hex_of(l->digests + 32 * (size_t)idx, want);
    hex_of(d, got);
    g.verify_failures++;
    l->bad[idx] = time(NULL);
    logf_("%s: chunk %u (bytes %" PRIu64 "-%" PRIu64 ") fails verification: sha256 %s, expected %s; the registry's blob is corrupt", l->hex, idx, off,
          off + len - 1, got, want);
    return -EIO;
  }
  cache_store(l, idx, g.buf, len);
  return (int)len;
}

/* ------------------------------------------------------------ fuse ops */

#define STATS_NAME ".stats"

static int stats_json(char *out, size_t n) {
  int w = snprintf(out, n,
                   "{\"fetches\":%" PRIu64 ",\"fetchedBytes\":%" PRIu64 ",\"hits\":%" PRIu64 ",\"verifyFailures\":%" PRIu64 ",\"fetchErrors\":%" PRIu64
                   ",\"evictions\":%" PRIu64 ",\"cacheBytes\":%" PRIu64 ",\"cacheLimit\":%" PRIu64 ",\"pid\":%d,\"layers\":{",
                   g.fetches, g.fetched_bytes, g.hits, g.verify_failures, g.fetch_errors, g.evictions, g.cache_bytes, g.cache_limit, (int)getpid());
  for (int i = 0; i < g.nlayers && w > 0 && (size_t)w < n; i++) {
    struct layer *l = g.layers[i];
    uint32_t cached = 0;
    for (uint32_t c = 0; c < l->nchunks; c++) cached += l->entries[c] != NULL;
    w += snprintf(out + w, n - (size_t)w, "%s\"sha256:%s\":{\"size\":%" PRIu64 ",\"fetches\":%" PRIu64 ",\"fetchedBytes\":%" PRIu64 ",\"hits\":%" PRIu64 ",\"cachedChunks\":%u,\"chunks\":%u}",
                  i ? "," : "", l->hex, l->size, l->fetches, l->fetched_bytes, l->hits, cached, l->nchunks);
  }
  if (w > 0 && (size_t)w < n) w += snprintf(out + w, n - (size_t)w, "}}\n");
  return w;
}

static void *lz_init(struct fuse_conn_info *conn, struct fuse_config *cfg) {
  cfg->kernel_cache = 1; /* the files never change: keep their pages */
  cfg->entry_timeout = 3600;
  cfg->attr_timeout = 3600;
  cfg->negative_timeout = 0;
  cfg->use_ino = 0;
  return NULL;
}

static int lz_getattr(const char *path, struct stat *st, struct fuse_file_info *fi) {
  memset(st, 0, sizeof *st);
  if (strcmp(path, "/") == 0) {
    st->st_mode = S_IFDIR | 0555;
    st->st_nlink = 2;
    return 0;
  }
  if (strcmp(path, "/" STATS_NAME) == 0) {
    st->st_mode = S_IFREG | 0444;
    st->st_nlink = 1;
    st->st_size = 0;
    return 0;
  }
  if (!is_hex64(path + 1)) return -ENOENT;
  struct layer *l = layer_load(path + 1, 1);
  if (!l) return -ENOENT;
  st->st_mode = S_IFREG | 0444;
  st->st_nlink = 1;
  st->st_size = (off_t)l->size;
  st->st_blksize = 4096;
  st->st_blocks = (blkcnt_t)((l->size + 511) / 512);
  return 0;
}

static int lz_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t off, struct fuse_file_info *fi, enum fuse_readdir_flags fl) {
  if (strcmp(path, "/") != 0) return -ENOTDIR;
  fill(buf, ".", NULL, 0, 0);
  fill(buf, "..", NULL, 0, 0);
  fill(buf, STATS_NAME, NULL, 0, 0);
  for (int i = 0; i < g.nlayers; i++) fill(buf, g.layers[i]->hex, NULL, 0, 0);
  return 0;
}

struct statsbuf { size_t len; char data[]; };

static int lz_open(const char *path, struct fuse_file_info *fi) {
  if ((fi->flags & O_ACCMODE) != O_RDONLY) return -EROFS;
  if (strcmp(path, "/" STATS_NAME) == 0) {
    size_t cap = 4096 + (size_t)g.nlayers * 256;
    struct statsbuf *s = malloc(sizeof *s + cap);
    if (!s) return -ENOMEM;
    int w = stats_json(s->data, cap);
    s->len = w < 0 ? 0 : ((size_t)w < cap ? (size_t)w : cap - 1);
    fi->fh = (uint64_t)(uintptr_t)s;
    fi->direct_io = 1;
    return 0;
  }
  if (!is_hex64(path + 1)) return -ENOENT;
  struct layer *l = layer_load(path + 1, 0);
  if (!l) return -ENOENT;
  fi->fh = 0;
  fi->keep_cache = 1;
  return 0;
}

static int lz_release(const char *path, struct fuse_file_info *fi) {
  if (fi->fh) free((void *)(uintptr_t)fi->fh);
  return 0;
}

static int lz_read(const char *path, char *out, size_t size, off_t off, struct fuse_file_info *fi) {
  if (fi->fh) {
    struct statsbuf *s = (struct statsbuf *)(uintptr_t)fi->fh;
    if ((size_t)off >= s->len) return 0;
    size_t n = s->len - (size_t)off < size ? s->len - (size_t)off : size;
    memcpy(out, s->data + off, n);
    return (int)n;
  }
  struct layer *l = layer_load(path + 1, 0);
  if (!l) return -ENOENT;
  if (off < 0) return -EINVAL;
  if ((uint64_t)off >= l->size) return 0;
  if ((uint64_t)off + size > l->size) size = (size_t)(l->size - (uint64_t)off);
  size_t done = 0;
  while (done < size) {
    uint64_t pos = (uint64_t)off + done;
    uint32_t idx = (uint32_t)(pos / l->chunk);
    uint32_t last = (uint32_t)(((uint64_t)off + size - 1) / l->chunk);
    int n = get_chunk(l, idx, last - idx + 1);
    if (n < 0) return done > 0 ? (int)done : n;
    uint32_t in = (uint32_t)(pos - (uint64_t)idx * l->chunk);
    size_t take = (size_t)n - in;
    if (take > size - done) take = size - done;
    memcpy(out + done, g.buf + in, take);
    done += take;
  }
  return (int)done;
}

static const struct fuse_operations ops = {
  .init = lz_init,
  .getattr = lz_getattr,
  .readdir = lz_readdir,
  .open = lz_open,
  .read = lz_read,
  .release = lz_release,
};

/* --------------------------------------------------- cache at startup */

struct found { time_t mtime; struct layer *l; uint32_t idx; uint32_t size; };

static int by_mtime(const void *a, const void *b) {
  const struct found *x = a, *y = b;
  return x->mtime < y->mtime ? -1 : x->mtime > y->mtime;
}

/* Take over what an earlier daemon cached: chunks of layers that still have a descriptor
 * (oldest first into the LRU, so the newest are the most recent), and remove the rest
 * (layers removed from the node, temporary files of an interrupted write). */
static void cache_scan(void) {
  DIR *d = opendir(g.cache);
  if (!d) return;
  struct found *all = NULL;
  size_t n = 0, cap = 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    if (de->d_name[0] == '.') continue;
    char sub[4096];
    snprintf(sub, sizeof sub, "%s/%s", g.cache, de->d_name);
    struct layer *l = is_hex64(de->d_name) ? layer_load(de->d_name, 1) : NULL;
    DIR *s = opendir(sub);
    if (!s) { unlink(sub); continue; }
    struct dirent *fe;
    while ((fe = readdir(s))) {
      if (fe->d_name[0] == '.') continue;
      char p[8200];
      snprintf(p, sizeof p, "%s/%s", sub, fe->d_name);
      char *end;
      unsigned long idx = strtoul(fe->d_name, &end, 10);
      struct stat st;
      if (!l || *end != 0 || idx >= l->nchunks || stat(p, &st) != 0 || !S_ISREG(st.st_mode) || l->entries[idx]) { unlink(p); continue; }
      if (n == cap) {
        cap = cap ? cap * 2 : 256;
        struct found *na = realloc(all, cap * sizeof *all);
        if (!na) { unlink(p); continue; }
        all = na;
      }
      all[n++] = (struct found){ st.st_mtime, l, (uint32_t)idx, (uint32_t)st.st_size };
      l->entries[idx] = (struct centry *)1; /* placeholder against duplicates */
    }
    closedir(s);
    if (!l) rmdir(sub);
  }
  closedir(d);
  qsort(all, n, sizeof *all, by_mtime);
  for (size_t i = 0; i < n; i++) {
    all[i].l->entries[all[i].idx] = NULL;
    cache_add(all[i].l, all[i].idx, all[i].size, 0);
  }
  free(all);
  evict_until(0);
  if (n) logf_("took over %zu cached chunks (%" PRIu64 " bytes)", n, g.cache_bytes);
}

/* ----------------------------------------------------------------- main */

static void usage(void) {
  fprintf(stderr, "usage: warren-lazyfs MOUNTPOINT --desc DIR --cache DIR --cache-bytes N [--pid-file F]\n");
  exit(2);
}

int main(int argc, char **argv) {
  const char *mnt = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--desc") == 0 && i + 1 < argc) g.desc = argv[++i];
    else if (strcmp(argv[i], "--cache") == 0 && i + 1 < argc) g.cache = argv[++i];
    else if (strcmp(argv[i], "--cache-bytes") == 0 && i + 1 < argc) g.cache_limit = strtoull(argv[++i], NULL, 10);
    else if (strcmp(argv[i], "--pid-file") == 0 && i + 1 < argc) g.pidfile = argv[++i];
    else if (argv[i][0] != '-' && !mnt) mnt = argv[i];
    else usage();
  }
  if (!mnt || !g.desc || !g.cache) usage();
  signal(SIGPIPE, SIG_IGN);
  if (curl_global_init(CURL_GLOBAL_DEFAULT) != 0 || !(g.curl = curl_easy_init())) {
    logf_("cannot initialise libcurl");
    return 1;
  }
  g.buf = malloc(MAX_CHUNK);
  g.run = malloc(MAX_RUN_BYTES > MAX_CHUNK ? MAX_RUN_BYTES : MAX_CHUNK);
  if (!g.buf || !g.run) return 1;
  mkdir(g.cache, 0700);
  cache_scan();

  char *fargv[] = { argv[0], "-o", "ro,allow_other,fsname=warren-lazyfs,subtype=warren-lazyfs", NULL };
  struct fuse_args args = FUSE_ARGS_INIT(3, fargv);
  struct fuse *f = fuse_new(&args, &ops, sizeof ops, NULL);
  if (!f) return 1;
  if (fuse_mount(f, mnt) != 0) {
    logf_("cannot mount on %s", mnt);
    fuse_destroy(f);
    return 1;
  }
  if (fuse_set_signal_handlers(fuse_get_session(f)) != 0) {
    fuse_unmount(f);
    fuse_destroy(f);
    return 1;
  }
  if (g.pidfile) {
    FILE *pf = fopen(g.pidfile, "we");
    if (pf) { fprintf(pf, "%d\n", (int)getpid()); fclose(pf); }
  }
  logf_("serving %s (cache %s, limit %" PRIu64 " bytes)", mnt, g.cache, g.cache_limit);
  int r = fuse_loop(f);
  fuse_remove_signal_handlers(fuse_get_session(f));
  fuse_unmount(f);
  fuse_destroy(f);
  if (g.pidfile) unlink(g.pidfile);
  logf_("stopped");
  curl_easy_cleanup(g.curl);
  curl_global_cleanup();
  return r < 0 ? 1 : 0;
}
