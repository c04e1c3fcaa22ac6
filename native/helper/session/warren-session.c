/*
 * warren-session: the per-session holder of a Warren shell session.
 *
 * It owns one shell (in command mode: pipes for stdin/stdout/stderr plus a
 * status pipe on fd 3; in pty mode: a terminal) and one bounded ring of
 * output, and serves any number of clients over a unix stream socket. It is
 * detached from whoever started it, so a gateway that dies (kill -9) and comes
 * back re-attaches by socket path and receives the output it missed.
 *
 * Single-threaded poll loop. The ring stores records in their wire format
 * (OUTPUT / EXIT / CLOSED frames), so sending to a client is a writev of ring
 * bytes: no per-client copies, no allocation on the hot path. Each client has
 * a cursor into the ring; a client that falls behind the oldest retained
 * record is moved forward and told how many bytes it lost (LOST frame).
 *
 * The protocol is documented in docs/session-holder.md. Keep both in sync.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#ifndef TIOCGPTPEER
#define TIOCGPTPEER _IO('T', 0x41)
#endif
#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

/* ---- wire format ------------------------------------------------------- */

enum {
	/* client -> holder */
	F_ATTACH = 0x01, /* u64 from_offset */
	F_INPUT = 0x02,  /* bytes */
	F_RESIZE = 0x03, /* u16 cols, u16 rows */
	F_SIGNAL = 0x04, /* u8 signo, u8 target */
	F_MARK = 0x05,   /* (empty) */
	F_INFO = 0x06,   /* (empty) */
	F_CLOSE = 0x07,  /* (empty) */
	/* holder -> client */
	F_OUTPUT = 0x81, /* u8 stream, u64 offset, bytes */
	F_LOST = 0x82,   /* u64 bytes */
	F_EXIT = 0x83,   /* i32 code, i32 signal */
	F_INFO_R = 0x84, /* json */
	F_CLOSED = 0x85, /* (empty) */
};

enum { S_STDOUT = 1, S_STDERR = 2, S_STATUS = 3, S_PTY = 4 };
enum { T_CHILD = 0, T_FOREGROUND = 1, T_TREE = 2, T_SHELL = 3 };

#define HDR 5                 /* u8 type, u32 length */
#define OUT_HDR (HDR + 9)     /* + u8 stream, u64 offset */
#define MAX_CHUNK 65536       /* largest OUTPUT payload data */
#define MAX_IN_FRAME 65536    /* largest INPUT payload */
#define MAX_CLIENTS 64
#define INFO_MAX 16384        /* largest --info JSON */
#define PEND_CAP (OUT_HDR + MAX_CHUNK + 64 + HDR + INFO_MAX + 4096) /* INFO: --info plus fields and recent status lines */
#define RBUF_CAP (HDR + MAX_IN_FRAME)
#define IBUF_CAP (256 * 1024)
#define MIN_BUFFER 4096
#define MAX_BUFFER (1ULL << 32)
#define MAX_PROCS 8192
#define WRITE_BUDGET (4 << 20)  /* most ring bytes sent to one client per writev */

static void put_u32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = v >> (8 * i); }
static void put_u64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = v >> (8 * i); }
static uint16_t get_u16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t get_u32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t get_u64(const uint8_t *p) { uint64_t v = 0; for (int i = 7; i >= 0; i--) v = v << 8 | p[i]; return v; }

/* ---- state ------------------------------------------------------------- */

struct client {
	int fd;
	int attached;
	int want_info;
	int stalled; /* an INPUT frame waits for room in ibuf */
	int dead;
	uint64_t pos;  /* next ring byte to send */
	uint64_t bnd;  /* start of the ring frame that contains pos (== pos at a frame boundary) */
	uint64_t lost; /* output bytes dropped for this client, not yet reported */
	int64_t progress_ms; /* last time it took bytes or had nothing left to take */
	uint8_t *rbuf; size_t rlen;
	uint8_t *pend; size_t pend_len, pend_off; /* bytes to send before resuming from the ring */
};

static int mode_pty;
static const char *sock_path;
static char sock_tmp[sizeof(((struct sockaddr_un *)0)->sun_path)];
static ino_t sock_ino;
static dev_t sock_dev;
static const char *info_json = "{}";
static const char *ptmx_path;
static unsigned cols = 80, rows = 24;
static unsigned long linger_ms = 300000;
static unsigned long stall_ms = 500;
/* Command mode: how many generations below the child are the shell and what starts it
 * (0: the child is the shell; 1: the child is a launcher, such as warren-nsexec, whose own
 * child is the shell). Signals to "the command" never reach them. */
static int shell_depth;
static int ready_fd = -1;
/* --control-fd N: the child is a bridge to a shell elsewhere (warren-vmshell to a microVM's
 * guest), so the processes a signal is meant for are not the holder's descendants. MARKs and
 * SIGNALs for the shell, the command or the tree go to the bridge as 2-byte records
 * (signo, target; signo 0 is a MARK) on a pipe it reads at fd N, for the far end to apply
 * with the same meaning. ctl_fd is the holder's write end. */
static int ctl_child_fd = -1;
static int ctl_fd = -1;

static uint8_t *rb;                 /* the ring */
static uint64_t cap, r_head, r_tail; /* logical positions; byte at pos lives at rb[pos % cap] */
static uint64_t out_off, oldest_off;
static size_t chunk_max;
static uint64_t read_margin; /* most bytes one loop iteration may add to the ring */

static pid_t holder_pid, child_pid = -1;
static int child_reaped, exit_code = -1, exit_sig = 0;
static int fd_in = -1, fd_out = -1, fd_err = -1, fd_status = -1, fd_pty = -1;
static int listen_fd = -1, sig_fd = -1;
static char created_at[40];

static struct client *clients[MAX_CLIENTS];
static int nclients;

/* The last status lines of command mode, kept apart from the ring: a client
 * that fell behind (LOST) may have missed the line that ends its command, and
 * INFO still tells it how the command ended. */
#define RECENT_STATUS 16
#define STATUS_LINE_MAX 96
static char recent_status[RECENT_STATUS][STATUS_LINE_MAX];
static int recent_status_next;
static char status_partial[STATUS_LINE_MAX];
static size_t status_partial_len;
static int status_partial_bad;

static uint8_t ibuf[IBUF_CAP]; /* input not yet accepted by the child's stdin / pty */
static size_t ibuf_off, ibuf_len;

static uint8_t iobuf[MAX_CHUNK];

static int closing;
static int64_t close_deadline, linger_deadline;

/* depth: generations below the holder's child (0 = the child itself), or -1 for a process
 * that is not under it (an orphan re-parented to the holder) */
struct proc { pid_t pid; unsigned long long start; int depth; };
static struct proc snap[MAX_PROCS]; static int nsnap, marked; /* descendants at the last MARK, sorted by pid */
static struct proc scan[MAX_PROCS]; static int nscan;
static char procbuf[65536];

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Startup failure: tell the starter on the ready fd (and stderr), exit. */
static void fail(const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	if (ready_fd >= 0) dprintf(ready_fd, "error %s\n", msg);
	fprintf(stderr, "warren-session: %s\n", msg);
	if (sock_tmp[0]) unlink(sock_tmp);
	if (child_pid > 0) { kill(child_pid, SIGKILL); waitpid(child_pid, NULL, 0); }
	exit(1);
}

/* ---- ring -------------------------------------------------------------- */

static void ring_put(uint64_t pos, const void *src, size_t n)
{
	size_t i = pos % cap, first = n < cap - i ? n : cap - i;
	memcpy(rb + i, src, first);
	if (n > first) memcpy(rb, (const uint8_t *)src + first, n - first);
}

static void ring_get(uint64_t pos, void *dst, size_t n)
{
	size_t i = pos % cap, first = n < cap - i ? n : cap - i;
	memcpy(dst, rb + i, first);
	if (n > first) memcpy((uint8_t *)dst + first, rb, n - first);
}

static uint64_t frame_size_at(uint64_t pos)
{
	uint8_t h[HDR];
	ring_get(pos, h, HDR);
	return HDR + (uint64_t)get_u32(h + 1);
}

static int pend_room(struct client *c, size_t n) { return PEND_CAP - c->pend_len >= n; }

/* Drop the oldest record. Clients that had not started it lose it; a client
 * in the middle of it keeps the rest in its pending buffer so its stream of
 * frames stays well-formed. */
static void ring_evict_one(void)
{
	uint8_t h[HDR];
	ring_get(r_tail, h, HDR);
	uint64_t size = HDR + (uint64_t)get_u32(h + 1);
	uint64_t outlen = h[0] == F_OUTPUT ? size - OUT_HDR : 0;
	uint64_t end = r_tail + size;
	for (int i = 0; i < nclients; i++) {
		struct client *c = clients[i];
		if (!c->attached || c->pos >= end) continue;
		if (c->pos == r_tail) {
			c->lost += outlen;
		} else if (pend_room(c, end - c->pos)) {
			ring_get(c->pos, c->pend + c->pend_len, end - c->pos);
			c->pend_len += end - c->pos;
		} else {
			c->dead = 1; /* cannot happen: pend is empty while mid-frame */
		}
		c->pos = c->bnd = end;
	}
	r_tail = end;
	oldest_off += outlen;
}

static void ring_make_room(uint64_t n)
{
	while (r_head + n - r_tail > cap) ring_evict_one();
}

static void ring_output(int stream, const uint8_t *data, size_t n)
{
	uint8_t h[OUT_HDR];
	h[0] = F_OUTPUT;
	put_u32(h + 1, (uint32_t)(9 + n));
	h[5] = (uint8_t)stream;
	put_u64(h + 6, out_off);
	ring_make_room(OUT_HDR + n);
	ring_put(r_head, h, OUT_HDR);
	ring_put(r_head + OUT_HDR, data, n);
	r_head += OUT_HDR + n;
	out_off += n;
}

static void ring_frame(uint8_t type, const uint8_t *payload, uint32_t n)
{
	uint8_t h[HDR];
	h[0] = type;
	put_u32(h + 1, n);
	ring_make_room(HDR + n);
	ring_put(r_head, h, HDR);
	if (n) ring_put(r_head + HDR, payload, n);
	r_head += HDR + n;
}

/* ---- processes --------------------------------------------------------- */

static ssize_t read_file(const char *path, char *buf, size_t size)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) return -1;
	size_t got = 0;
	while (got + 1 < size) {
		ssize_t n = read(fd, buf + got, size - 1 - got);
		if (n < 0) { if (errno == EINTR) continue; close(fd); return -1; }
		if (n == 0) break;
		got += (size_t)n;
	}
	close(fd);
	buf[got] = 0;
	return (ssize_t)got;
}

/* Parse /proc/<pid>/stat: state, num_threads, starttime. 0 on success. */
static int proc_stat(pid_t pid, char *state, long *threads, unsigned long long *start)
{
	char path[64], buf[1024];
	snprintf(path, sizeof path, "/proc/%d/stat", pid);
	if (read_file(path, buf, sizeof buf) <= 0) return -1;
	char *p = strrchr(buf, ')');
	if (!p || p[1] != ' ') return -1;
	p += 2;
	*state = *p;
	/* p is at field 3 (state); num_threads is field 20, starttime field 22 */
	for (int field = 3; field < 22; field++) {
		p = strchr(p, ' ');
		if (!p) return -1;
		p++;
		if (field + 1 == 20) *threads = strtol(p, NULL, 10);
	}
	*start = strtoull(p, NULL, 10);
	return 0;
}

static void scan_add_children_of_task(pid_t pid, const char *tid, int depth)
{
	char path[96];
	snprintf(path, sizeof path, "/proc/%d/task/%s/children", pid, tid);
	if (read_file(path, procbuf, sizeof procbuf) <= 0) return;
	char *p = procbuf;
	while (*p && nscan < MAX_PROCS) {
		char *end;
		long v = strtol(p, &end, 10);
		if (end == p) break;
		scan[nscan].pid = (pid_t)v;
		scan[nscan].start = 0;
		/* the parent's depth is known: the holder's own children are the child (0) or orphans */
		scan[nscan].depth = pid == holder_pid ? ((pid_t)v == child_pid ? 0 : -1) : depth < 0 ? -1 : depth + 1;
		nscan++;
		p = end;
		while (*p == ' ' || *p == '\n') p++;
	}
}

static void scan_add_children(pid_t pid, long threads, int depth)
{
	char tid[24];
	if (threads <= 1) {
		snprintf(tid, sizeof tid, "%d", pid);
		scan_add_children_of_task(pid, tid, depth);
		return;
	}
	char path[64];
	snprintf(path, sizeof path, "/proc/%d/task", pid);
	DIR *d = opendir(path);
	if (!d) return;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
		scan_add_children_of_task(pid, e->d_name, depth);
	}
	closedir(d);
}

/* All live descendants of the holder (the child, its tree, and orphans that
 * were re-parented to the holder, which is a child subreaper), breadth first.
 * Zombies are left out. */
static void scan_tree(void)
{
	nscan = 0;
	scan_add_children(holder_pid, 1, -1);
	int out = 0;
	for (int i = 0; i < nscan; i++) {
		char state;
		long threads = 1;
		unsigned long long start;
		pid_t pid = scan[i].pid;
		if (proc_stat(pid, &state, &threads, &start) != 0 || state == 'Z' || state == 'X') continue;
		scan_add_children(pid, threads, scan[i].depth);
		/* scan[] is both the queue (children are appended at nscan) and the
		 * result (compacted to out); out <= i, so nothing unread is overwritten */
		scan[out].pid = pid;
		scan[out].start = start;
		scan[out].depth = scan[i].depth;
		out++;
	}
	nscan = out;
}

static int proc_cmp(const void *a, const void *b)
{
	pid_t x = ((const struct proc *)a)->pid, y = ((const struct proc *)b)->pid;
	return (x > y) - (x < y);
}

static void mark(void)
{
	scan_tree();
	memcpy(snap, scan, sizeof(struct proc) * (size_t)nscan);
	nsnap = nscan;
	marked = 1;
	qsort(snap, (size_t)nsnap, sizeof(struct proc), proc_cmp);
}

static void reap(void);

static int in_snapshot(const struct proc *p)
{
	const struct proc *hit = bsearch(p, snap, (size_t)nsnap, sizeof(struct proc), proc_cmp);
	return hit && hit->start == p->start;
}

/* Send signo to every descendant (all = 1) or to those not in the last MARK
 * snapshot (all = 0). For SIGKILL, repeat until nothing is left, so a process
 * that forks while we kill, or children re-parented to us, die too. Returns
 * how many processes were signalled. */
static int signal_tree(int signo, int all)
{
	int total = 0;
	if (!all && !marked) return 0; /* no MARK yet: no command has started */
	for (int pass = 0; pass < 200; pass++) {
		scan_tree();
		int n = 0;
		for (int i = 0; i < nscan; i++) {
			/* The shell (and a launcher in front of it) is never "what the command started",
			 * also when it came up after the MARK: a launcher that is still entering the
			 * sandbox when the first command arrives starts the shell after the snapshot. */
			if (!all && ((scan[i].depth >= 0 && scan[i].depth <= shell_depth) || in_snapshot(&scan[i]))) continue;
			if (kill(scan[i].pid, signo) == 0) n++;
		}
		total += n;
		if (signo != SIGKILL || n == 0) break;
		reap(); /* so dead children stop showing up */
		if (pass > 0) usleep(1000);
	}
	return total;
}

/* Does pid hold an fd on the pipe with this inode? */
static int holds_pipe(pid_t pid, ino_t ino)
{
	char path[64], want[48], link[64];
	snprintf(path, sizeof path, "/proc/%d/fd", pid);
	int n = snprintf(want, sizeof want, "pipe:[%lu]", (unsigned long)ino);
	DIR *d = opendir(path);
	if (!d) return 0;
	int found = 0;
	struct dirent *e;
	while (!found && (e = readdir(d))) {
		if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
		ssize_t l = readlinkat(dirfd(d), e->d_name, link, sizeof link);
		found = l == n && memcmp(link, want, (size_t)n) == 0;
	}
	closedir(d);
	return found;
}

/* Command mode: signal the shell, i.e. every descendant that holds the
 * session's stdin pipe (the shell keeps it, saved, while a command runs with
 * stdin from /dev/null; a helper such as warren-nsexec in front of the shell
 * holds it too). Commands and their children do not hold it. */
static void signal_shell(int signo)
{
	struct stat st;
	if (mode_pty || fd_in < 0 || fstat(fd_in, &st) != 0) return;
	scan_tree();
	for (int i = 0; i < nscan; i++) {
		if (holds_pipe(scan[i].pid, st.st_ino)) kill(scan[i].pid, signo);
	}
}

/* ---- output from the child -------------------------------------------- */

static void close_fd(int *fd)
{
	if (*fd >= 0) { close(*fd); *fd = -1; }
}

/* One read from an output fd into the ring. 1: got data, 0: would block, -1: EOF (fd closed). */
/* Remember complete status lines ("<id> <code>", [A-Za-z0-9_-] and digits
 * only) as "<id> <code> <offset just past the line>"; `at` is the output
 * offset of data[0]. */
static void note_status(const uint8_t *data, size_t n, uint64_t at)
{
	for (size_t i = 0; i < n; i++) {
		uint8_t ch = data[i];
		if (ch == '\n') {
			if (!status_partial_bad && status_partial_len > 0) {
				snprintf(recent_status[recent_status_next], STATUS_LINE_MAX, "%.*s %llu", (int)status_partial_len, status_partial,
					(unsigned long long)(at + i + 1));
				recent_status_next = (recent_status_next + 1) % RECENT_STATUS;
			}
			status_partial_len = 0;
			status_partial_bad = 0;
			continue;
		}
		int ok = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_' || ch == '-' || ch == ' ';
		if (!ok || status_partial_len + 24 >= STATUS_LINE_MAX) status_partial_bad = 1;
		else status_partial[status_partial_len++] = (char)ch;
	}
}

static int read_output(int *fd, int stream)
{
	if (*fd < 0) return -1;
	ssize_t n = read(*fd, iobuf, chunk_max);
	if (n > 0) {
		if (stream == S_STATUS) note_status(iobuf, (size_t)n, out_off);
		ring_output(stream, iobuf, (size_t)n);
		return 1;
	}
	if (n < 0 && (errno == EAGAIN || errno == EINTR)) return 0;
	/* 0 = EOF on a pipe; EIO = the pty slave side is gone */
	if (stream == S_PTY) fd_in = -1;
	close_fd(fd);
	return -1;
}

/* Read until EAGAIN or EOF, but at most `limit` bytes (a writer that never
 * stops must not hold the loop). */
static void drain(int *fd, int stream, size_t limit)
{
	size_t got = 0;
	while (*fd >= 0 && got < limit) {
		uint64_t before = out_off;
		if (read_output(fd, stream) <= 0) break;
		got += out_off - before;
	}
}

static size_t pipe_capacity(int fd)
{
	if (fd < 0) return 0;
	int n = fcntl(fd, F_GETPIPE_SZ);
	return n > 0 ? (size_t)n : 65536;
}

static void on_child_exit(int status)
{
	child_reaped = 1;
	if (WIFSIGNALED(status)) { exit_code = -1; exit_sig = WTERMSIG(status); }
	else { exit_code = WEXITSTATUS(status); exit_sig = 0; }
	/* Whatever the child wrote before it died is in the pipes: record it first. */
	if (mode_pty) {
		drain(&fd_pty, S_PTY, 1 << 20);
		close_fd(&fd_pty);
		fd_in = -1;
	} else {
		drain(&fd_out, S_STDOUT, pipe_capacity(fd_out));
		drain(&fd_err, S_STDERR, pipe_capacity(fd_err));
		drain(&fd_status, S_STATUS, pipe_capacity(fd_status));
		close_fd(&fd_out);
		close_fd(&fd_err);
		close_fd(&fd_status);
		close_fd(&fd_in);
	}
	ibuf_off = ibuf_len = 0;
	uint8_t p[8];
	put_u32(p, (uint32_t)exit_code);
	put_u32(p + 4, (uint32_t)exit_sig);
	ring_frame(F_EXIT, p, 8);
}

static void reap(void)
{
	int status;
	pid_t pid;
	while ((pid = waitpid(-1, &status, WNOHANG | __WALL)) > 0) {
		if (pid == child_pid && !child_reaped) on_child_exit(status);
	}
}

/* ---- input to the child ----------------------------------------------- */

static void unstall_clients(void);

static void input_flush(void)
{
	while (ibuf_len > 0 && fd_in >= 0) {
		ssize_t n = write(fd_in, ibuf + ibuf_off, ibuf_len);
		if (n < 0) {
			if (errno == EINTR) continue;
			if (errno == EAGAIN) return;
			/* EPIPE / EIO: the child no longer reads */
			if (!mode_pty) close_fd(&fd_in);
			ibuf_off = ibuf_len = 0;
			break;
		}
		ibuf_off += (size_t)n;
		ibuf_len -= (size_t)n;
	}
	if (ibuf_len == 0) ibuf_off = 0;
	unstall_clients();
}

/* Queue input for the child. 0 when there is no room yet (the caller stalls). */
static int input_push(const uint8_t *p, size_t n)
{
	if (fd_in < 0 || closing) return 1; /* nobody reads: drop */
	if (IBUF_CAP - ibuf_len < n) return 0;
	size_t done = 0;
	if (ibuf_len == 0) {
		while (done < n) {
			ssize_t w = write(fd_in, p + done, n - done);
			if (w < 0) {
				if (errno == EINTR) continue;
				if (errno == EAGAIN) break;
				if (!mode_pty) close_fd(&fd_in);
				return 1;
			}
			done += (size_t)w;
		}
	}
	if (done < n) {
		if (ibuf_off + ibuf_len + (n - done) > IBUF_CAP) {
			memmove(ibuf, ibuf + ibuf_off, ibuf_len);
			ibuf_off = 0;
		}
		memcpy(ibuf + ibuf_off + ibuf_len, p + done, n - done);
		ibuf_len += n - done;
	}
	return 1;
}

/* ---- clients ----------------------------------------------------------- */

static void start_close(struct client *c);

static void pend_frame(struct client *c, uint8_t type, const void *payload, size_t n)
{
	if (!pend_room(c, HDR + n)) { c->dead = 1; return; }
	c->pend[c->pend_len] = type;
	put_u32(c->pend + c->pend_len + 1, (uint32_t)n);
	if (n) memcpy(c->pend + c->pend_len + HDR, payload, n);
	c->pend_len += HDR + n;
}

static void pend_info(struct client *c)
{
	char j[INFO_MAX + 1024 + RECENT_STATUS * (STATUS_LINE_MAX + 3)];
	char code[16] = "null", sig[16] = "null";
	if (child_reaped) {
		if (exit_sig) snprintf(sig, sizeof sig, "%d", exit_sig);
		else snprintf(code, sizeof code, "%d", exit_code);
	}
	/* oldest first; the lines hold only [A-Za-z0-9_- ], so they need no escaping */
	char st[RECENT_STATUS * (STATUS_LINE_MAX + 3) + 3];
	size_t sl = 0;
	st[sl++] = '[';
	for (int k = 0; k < RECENT_STATUS; k++) {
		const char *line = recent_status[(recent_status_next + k) % RECENT_STATUS];
		if (!line[0]) continue;
		sl += (size_t)snprintf(st + sl, sizeof st - sl, "%s\"%s\"", sl > 1 ? "," : "", line);
	}
	st[sl++] = ']';
	st[sl] = 0;
	int n = snprintf(j, sizeof j,
		"{\"mode\":\"%s\",\"pid\":%d,\"childPid\":%d,\"createdAt\":\"%s\","
		"\"outputOffset\":%llu,\"oldestOffset\":%llu,\"bufferBytes\":%llu,"
		"\"alive\":%s,\"exitCode\":%s,\"exitSignal\":%s,\"clients\":%d,\"recentStatus\":%s,\"info\":%s}",
		mode_pty ? "pty" : "command", holder_pid, child_pid, created_at,
		(unsigned long long)out_off, (unsigned long long)oldest_off, (unsigned long long)cap,
		child_reaped ? "false" : "true", code, sig, nclients, st, info_json);
	if (n < 0 || (size_t)n >= sizeof j) n = 0;
	pend_frame(c, F_INFO_R, j, (size_t)n);
}

/* Position a new attachment at output offset `from`. */
static void attach(struct client *c, uint64_t from)
{
	c->attached = 1;
	c->progress_ms = now_ms();
	c->lost = 0;
	if (from > out_off) from = out_off;
	if (from < oldest_off) {
		c->lost = oldest_off - from;
		c->pos = c->bnd = r_tail;
		return;
	}
	uint64_t p = r_tail;
	while (p < r_head) {
		uint8_t h[OUT_HDR];
		ring_get(p, h, HDR);
		uint64_t size = HDR + (uint64_t)get_u32(h + 1);
		if (h[0] != F_OUTPUT) break;
		ring_get(p, h, OUT_HDR);
		uint64_t off = get_u64(h + 6), len = size - OUT_HDR;
		if (off + len > from) {
			if (off < from) {
				/* resend the tail of this record as a frame of its own */
				uint64_t skip = from - off, rest = len - skip;
				uint8_t *d = c->pend + c->pend_len;
				d[0] = F_OUTPUT;
				put_u32(d + 1, (uint32_t)(9 + rest));
				d[5] = h[5];
				put_u64(d + 6, from);
				ring_get(p + OUT_HDR + skip, d + OUT_HDR, rest);
				c->pend_len += OUT_HDR + rest;
				p += size;
			}
			break;
		}
		p += size;
	}
	c->pos = c->bnd = p;
}

static int client_has_pending(const struct client *c)
{
	if (c->pend_off < c->pend_len) return 1;
	int at_bnd = !c->attached || c->pos == c->bnd;
	if (at_bnd && (c->want_info || c->lost)) return 1;
	return c->attached && c->pos < r_head;
}

static void client_flush(struct client *c)
{
	while (!c->dead) {
		if (c->pend_off < c->pend_len) {
			ssize_t n = send(c->fd, c->pend + c->pend_off, c->pend_len - c->pend_off, MSG_NOSIGNAL | MSG_DONTWAIT);
			if (n < 0) {
				if (errno == EINTR) continue;
				if (errno != EAGAIN) c->dead = 1;
				return;
			}
			c->pend_off += (size_t)n;
			if (n > 0) c->progress_ms = now_ms();
			continue;
		}
		c->pend_off = c->pend_len = 0;
		int at_bnd = !c->attached || c->pos == c->bnd;
		if (at_bnd && c->attached && c->lost) {
			uint8_t p[8];
			put_u64(p, c->lost);
			c->lost = 0;
			pend_frame(c, F_LOST, p, 8);
			continue;
		}
		if (at_bnd && c->want_info) {
			c->want_info = 0;
			pend_info(c);
			continue;
		}
		if (c->attached && c->pos < r_head) {
			uint64_t n = r_head - c->pos;
			if (n > WRITE_BUDGET) n = WRITE_BUDGET;
			size_t i = c->pos % cap;
			struct iovec iov[2];
			int cnt = 1;
			iov[0].iov_base = rb + i;
			iov[0].iov_len = n < cap - i ? n : cap - i;
			if (n > iov[0].iov_len) {
				iov[1].iov_base = rb;
				iov[1].iov_len = n - iov[0].iov_len;
				cnt = 2;
			}
			ssize_t w = writev(c->fd, iov, cnt);
			if (w < 0) {
				if (errno == EINTR) continue;
				if (errno != EAGAIN) c->dead = 1;
				return;
			}
			c->pos += (uint64_t)w;
			if (w > 0) c->progress_ms = now_ms();
			while (c->bnd < c->pos) {
				uint64_t sz = frame_size_at(c->bnd);
				if (c->bnd + sz > c->pos) break;
				c->bnd += sz;
			}
			continue;
		}
		c->progress_ms = now_ms(); /* caught up */
		return;
	}
}

/* Backpressure: reading another chunk from the child would drop bytes that an
 * attached, still-reading client has not been sent yet. Such a client holds
 * the child's output back (the child blocks on its full pipe or terminal),
 * but only while it keeps making progress: one that took nothing for stall_ms
 * no longer counts and falls behind (LOST) instead. With nobody attached,
 * old output is simply dropped. Returns 1 when output must wait; *wake is
 * when to look again. */
static int output_blocked(int64_t now, int64_t *wake)
{
	int blocked = 0;
	for (int i = 0; i < nclients; i++) {
		struct client *c = clients[i];
		if (!c->attached || c->dead || stall_ms == 0) continue;
		int64_t stalls_at = c->progress_ms + (int64_t)stall_ms;
		if (now >= stalls_at) continue;
		if (r_head + read_margin - c->pos <= cap) continue;
		blocked = 1;
		if (!*wake || stalls_at < *wake) *wake = stalls_at;
	}
	return blocked;
}

/* 1: the bridge has the record. A full pipe (a bridge that stopped reading) or a bridge
 * that has gone drops it; the caller then acts on what the holder can reach. */
static int ctl_send(uint8_t signo, uint8_t target)
{
	if (ctl_fd < 0) return 0;
	uint8_t rec[2] = { signo, target };
	ssize_t n;
	do n = write(ctl_fd, rec, sizeof rec); while (n < 0 && errno == EINTR);
	return n == (ssize_t)sizeof rec;
}

static void client_signal(uint8_t signo, uint8_t target)
{
	if (signo == 0 || signo > 64) return;
	if (target != T_CHILD && ctl_send(signo, target)) return;
	if (target == T_CHILD) {
		if (!child_reaped) kill(child_pid, signo);
	} else if (target == T_FOREGROUND) {
		if (mode_pty) {
			if (fd_pty >= 0) {
				pid_t pg = tcgetpgrp(fd_pty);
				if (pg > 0) kill(-pg, signo);
			}
		} else {
			signal_tree(signo, 0);
		}
	} else if (target == T_TREE) {
		signal_tree(signo, 1);
	} else if (target == T_SHELL) {
		signal_shell(signo);
	}
	reap();
}

static size_t max_payload(uint8_t type)
{
	switch (type) {
	case F_ATTACH: return 8;
	case F_INPUT: return MAX_IN_FRAME;
	case F_RESIZE: return 4;
	case F_SIGNAL: return 2;
	case F_MARK: case F_INFO: case F_CLOSE: return 256; /* payload ignored, room for later use */
	default: return 0;
	}
}

/* Handle the complete frames in the client's read buffer. */
static void client_process(struct client *c)
{
	size_t off = 0;
	while (!c->dead && !closing && c->rlen - off >= HDR) {
		uint8_t type = c->rbuf[off];
		uint32_t len = get_u32(c->rbuf + off + 1);
		size_t max = max_payload(type);
		if (max == 0 || len > max) { c->dead = 1; break; } /* unknown type or oversized */
		if (c->rlen - off < HDR + (size_t)len) break;
		const uint8_t *p = c->rbuf + off + HDR;
		switch (type) {
		case F_ATTACH:
			if (len != 8 || c->attached) { c->dead = 1; break; }
			attach(c, get_u64(p));
			break;
		case F_INPUT:
			if (!input_push(p, len)) { c->stalled = 1; goto out; }
			break;
		case F_RESIZE:
			if (len != 4) { c->dead = 1; break; }
			if (mode_pty && fd_pty >= 0) {
				struct winsize ws = { .ws_col = get_u16(p), .ws_row = get_u16(p + 2) };
				if (ws.ws_col && ws.ws_row) ioctl(fd_pty, TIOCSWINSZ, &ws);
			}
			break;
		case F_SIGNAL:
			if (len != 2) { c->dead = 1; break; }
			client_signal(p[0], p[1]);
			break;
		case F_MARK:
			mark();
			ctl_send(0, 0);
			break;
		case F_INFO:
			c->want_info = 1;
			break;
		case F_CLOSE:
			start_close(c);
			break;
		}
		off += HDR + len;
	}
out:
	if (off) {
		memmove(c->rbuf, c->rbuf + off, c->rlen - off);
		c->rlen -= off;
	}
}

static void unstall_clients(void)
{
	for (int i = 0; i < nclients; i++) {
		struct client *c = clients[i];
		if (c->stalled && !c->dead && (IBUF_CAP - ibuf_len >= MAX_IN_FRAME || fd_in < 0)) {
			c->stalled = 0;
			client_process(c);
		}
	}
}

static void client_read(struct client *c)
{
	ssize_t n = recv(c->fd, c->rbuf + c->rlen, RBUF_CAP - c->rlen, MSG_DONTWAIT);
	if (n == 0) { c->dead = 1; return; }
	if (n < 0) {
		if (errno != EAGAIN && errno != EINTR) c->dead = 1;
		return;
	}
	c->rlen += (size_t)n;
	client_process(c);
}

static void accept_clients(void)
{
	for (;;) {
		int fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) return;
		struct client *c = NULL;
		if (nclients < MAX_CLIENTS) c = calloc(1, sizeof *c);
		if (c) {
			c->rbuf = malloc(RBUF_CAP);
			c->pend = malloc(PEND_CAP);
		}
		if (!c || !c->rbuf || !c->pend) {
			if (c) { free(c->rbuf); free(c->pend); free(c); }
			close(fd);
			continue;
		}
		c->fd = fd;
		clients[nclients++] = c;
		linger_deadline = 0;
	}
}

static void drop_dead_clients(void)
{
	int j = 0;
	for (int i = 0; i < nclients; i++) {
		struct client *c = clients[i];
		if (c->dead) {
			close(c->fd);
			free(c->rbuf);
			free(c->pend);
			free(c);
		} else {
			clients[j++] = c;
		}
	}
	nclients = j;
}

/* ---- lifetime ---------------------------------------------------------- */

static void unlink_socket(void)
{
	if (listen_fd >= 0) { close(listen_fd); listen_fd = -1; }
	if (sock_path) {
		/* only remove the path if it is still our socket */
		struct stat st;
		if (stat(sock_path, &st) == 0 && st.st_ino == sock_ino && st.st_dev == sock_dev) unlink(sock_path);
		sock_path = NULL;
	}
}

/* Kill the whole tree and reap it: the child and every orphan that was
 * re-parented to us (we are a subreaper), so nothing outlives the session. */
static void kill_everything(void)
{
	int64_t until = now_ms() + 2000;
	/* A bridge passes the kill on to the far end and then exits: give it a second to do so
	 * before it is killed here with the rest. */
	if (!child_reaped && ctl_send(SIGKILL, T_TREE)) {
		int64_t bridge_until = now_ms() + 1000;
		while (!child_reaped && now_ms() < bridge_until) {
			reap();
			if (!child_reaped) usleep(1000);
		}
	}
	for (;;) {
		signal_tree(SIGKILL, 1);
		reap();
		siginfo_t si;
		if (waitid(P_ALL, 0, &si, WEXITED | WNOHANG | WNOWAIT | __WALL) < 0 && errno == ECHILD) break; /* no children left */
		if (now_ms() >= until) break;
		usleep(1000);
	}
}

static void start_close(struct client *c)
{
	if (closing) return;
	closing = 1;
	unlink_socket();
	if (c && !c->attached) { c->attached = 1; c->pos = c->bnd = r_head; }
	kill_everything();
	close_fd(&fd_in);
	close_fd(&fd_out);
	close_fd(&fd_err);
	close_fd(&fd_status);
	close_fd(&fd_pty);
	ring_frame(F_CLOSED, NULL, 0);
	close_deadline = now_ms() + 2000;
}

static void finish(void)
{
	unlink_socket();
	kill_everything();
	for (int i = 0; i < nclients; i++) close(clients[i]->fd);
	exit(0);
}

/* ---- startup ----------------------------------------------------------- */

static void usage(void)
{
	fprintf(stderr,
		"usage: warren-session --socket PATH --mode command|pty --buffer-bytes N\n"
		"                      [--cols C --rows R] [--ptmx PATH] [--info JSON]\n"
		"                      [--ready-fd FD] [--linger-seconds S] [--stall-ms MS]\n"
		"                      [--shell-depth N] [--control-fd N] -- argv...\n");
	exit(2);
}

static unsigned long long parse_num(const char *s, const char *what, unsigned long long min, unsigned long long max)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || end == s || *end || s[0] == '-' || v < min || v > max) fail("bad %s: %s", what, s);
	return v;
}

static int move_high(int fd)
{
	int n = fcntl(fd, F_DUPFD_CLOEXEC, 10);
	if (n < 0) _exit(127);
	return n;
}

static void set_cloexec_from(int first)
{
	if (syscall(SYS_close_range, first, ~0U, CLOSE_RANGE_CLOEXEC) == 0) return;
	for (int fd = first; fd < 4096; fd++) {
		int fl = fcntl(fd, F_GETFD);
		if (fl >= 0) fcntl(fd, F_SETFD, fl | FD_CLOEXEC);
	}
}

static void close_inherited(int keep)
{
	if (keep < 3) {
		if (syscall(SYS_close_range, 3, ~0U, 0) == 0) return;
	} else if ((keep == 3 || syscall(SYS_close_range, 3, (unsigned)keep - 1, 0) == 0) && syscall(SYS_close_range, (unsigned)keep + 1, ~0U, 0) == 0) {
		return;
	}
	for (int fd = 3; fd < 4096; fd++)
		if (fd != keep) close(fd);
}

static void spawn_child(char **argv)
{
	int in[2], out[2], err[2], st[2], ep[2], ctl[2] = { -1, -1 };
	int master = -1, slave = -1;
	if (pipe2(ep, O_CLOEXEC)) fail("pipe: %s", strerror(errno));
	if (ctl_child_fd >= 0 && pipe2(ctl, O_CLOEXEC)) fail("pipe: %s", strerror(errno));
	if (mode_pty) {
		const char *ptmx = ptmx_path ? ptmx_path : "/dev/ptmx";
		master = open(ptmx, O_RDWR | O_NOCTTY | O_CLOEXEC);
		if (master < 0) fail("open %s: %s", ptmx, strerror(errno));
		int unlock = 0;
		if (ioctl(master, TIOCSPTLCK, &unlock)) fail("unlock pty: %s", strerror(errno));
		slave = ioctl(master, TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC);
		if (slave < 0) fail("open pty peer: %s", strerror(errno));
		struct winsize ws = { .ws_col = (unsigned short)cols, .ws_row = (unsigned short)rows };
		ioctl(master, TIOCSWINSZ, &ws);
	} else {
		if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC) || pipe2(st, O_CLOEXEC))
			fail("pipe: %s", strerror(errno));
	}
	sigset_t old;
	sigset_t all;
	sigfillset(&all);
	sigprocmask(SIG_BLOCK, &all, &old);
	pid_t pid = fork();
	if (pid < 0) fail("fork: %s", strerror(errno));
	if (pid == 0) {
		/* child: undo everything the holder changed, wire up stdio, exec */
		for (int s = 1; s < NSIG; s++) signal(s, SIG_DFL);
		sigset_t none;
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		setsid();
		int e = ep[1];
		int cf = ctl_child_fd >= 0 ? move_high(ctl[0]) : -1; /* out of the way of the stdio dup2s */
		if (mode_pty) {
			if (ioctl(slave, TIOCSCTTY, 0) < 0) goto fail;
			int s = move_high(slave);
			if (dup2(s, 0) < 0 || dup2(s, 1) < 0 || dup2(s, 2) < 0) goto fail;
			set_cloexec_from(3);
		} else {
			int a = move_high(in[0]), b = move_high(out[1]), c = move_high(err[1]), d = move_high(st[1]);
			if (dup2(a, 0) < 0 || dup2(b, 1) < 0 || dup2(c, 2) < 0 || dup2(d, 3) < 0) goto fail;
			set_cloexec_from(4);
		}
		/* after set_cloexec_from: dup2 leaves the new descriptor open across exec */
		if (cf >= 0 && dup2(cf, ctl_child_fd) < 0) goto fail;
		execvp(argv[0], argv);
	fail:;
		int code = errno;
		if (write(e, &code, sizeof code) < 0) {}
		_exit(127);
	}
	child_pid = pid;
	sigprocmask(SIG_SETMASK, &old, NULL);
	close(ep[1]);
	if (ctl_child_fd >= 0) {
		close(ctl[0]);
		ctl_fd = ctl[1];
		fcntl(ctl_fd, F_SETFL, fcntl(ctl_fd, F_GETFL) | O_NONBLOCK);
	}
	int code;
	ssize_t n;
	do n = read(ep[0], &code, sizeof code); while (n < 0 && errno == EINTR);
	close(ep[0]);
	if (n == sizeof code) {
		waitpid(pid, NULL, 0);
		child_pid = -1;
		fail("cannot run %s: %s", argv[0], strerror(code));
	}
	if (mode_pty) {
		close(slave);
		fd_pty = master;
		fd_in = master;
		fcntl(master, F_SETFL, fcntl(master, F_GETFL) | O_NONBLOCK);
	} else {
		close(in[0]); close(out[1]); close(err[1]); close(st[1]);
		fd_in = in[1]; fd_out = out[0]; fd_err = err[0]; fd_status = st[0];
		int fds[4] = { fd_in, fd_out, fd_err, fd_status };
		for (int i = 0; i < 4; i++) fcntl(fds[i], F_SETFL, fcntl(fds[i], F_GETFL) | O_NONBLOCK);
	}
}

static void make_socket(void)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	size_t len = strlen(sock_path);
	int n = snprintf(sock_tmp, sizeof sock_tmp, "%s.%d.tmp", sock_path, holder_pid);
	if (len >= sizeof sa.sun_path || n < 0 || (size_t)n >= sizeof sock_tmp) {
		sock_tmp[0] = 0;
		fail("socket path too long (at most %zu bytes): %s", sizeof sa.sun_path - 16, sock_path);
	}
	if (access(sock_path, F_OK) == 0) { sock_tmp[0] = 0; fail("socket path exists: %s", sock_path); }
	memcpy(sa.sun_path, sock_tmp, (size_t)n + 1);
	listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (listen_fd < 0) fail("socket: %s", strerror(errno));
	unlink(sock_tmp);
	mode_t um = umask(077);
	int r = bind(listen_fd, (struct sockaddr *)&sa, sizeof sa);
	umask(um);
	if (r) { int e = errno; sock_tmp[0] = 0; fail("bind %s: %s", sa.sun_path, strerror(e)); }
	chmod(sock_tmp, 0600);
	if (listen(listen_fd, 128)) fail("listen: %s", strerror(errno));
}

/* Publish the socket under its final name, atomically, never replacing one. */
static void publish_socket(void)
{
	if (link(sock_tmp, sock_path)) fail("publish %s: %s", sock_path, strerror(errno));
	unlink(sock_tmp);
	struct stat st;
	if (stat(sock_path, &st) == 0) { sock_ino = st.st_ino; sock_dev = st.st_dev; }
	sock_tmp[0] = 0;
}

int main(int argc, char **argv)
{
	const char *mode = NULL;
	unsigned long long buffer = 0;
	int i;
	holder_pid = getpid();
	for (i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (!strcmp(a, "--")) { i++; break; }
		if (i + 1 >= argc) usage();
		const char *v = argv[++i];
		if (!strcmp(a, "--socket")) sock_path = v;
		else if (!strcmp(a, "--mode")) mode = v;
		else if (!strcmp(a, "--buffer-bytes")) buffer = parse_num(v, "--buffer-bytes", MIN_BUFFER, MAX_BUFFER);
		else if (!strcmp(a, "--cols")) cols = (unsigned)parse_num(v, "--cols", 1, 65535);
		else if (!strcmp(a, "--rows")) rows = (unsigned)parse_num(v, "--rows", 1, 65535);
		else if (!strcmp(a, "--ptmx")) ptmx_path = v;
		else if (!strcmp(a, "--info")) info_json = v;
		else if (!strcmp(a, "--linger-seconds")) linger_ms = (unsigned long)parse_num(v, "--linger-seconds", 0, 86400 * 30) * 1000;
		else if (!strcmp(a, "--stall-ms")) stall_ms = (unsigned long)parse_num(v, "--stall-ms", 0, 3600 * 1000);
		else if (!strcmp(a, "--shell-depth")) shell_depth = (int)parse_num(v, "--shell-depth", 0, 4);
		else if (!strcmp(a, "--control-fd")) ctl_child_fd = (int)parse_num(v, "--control-fd", 4, 9);
		else if (!strcmp(a, "--ready-fd")) {
			ready_fd = (int)parse_num(v, "--ready-fd", 0, 1 << 20);
			if (fcntl(ready_fd, F_GETFD) < 0) { ready_fd = -1; fail("--ready-fd %s is not open", v); }
			/* keep it away from stdio and out of the child */
			ready_fd = fcntl(ready_fd, F_DUPFD_CLOEXEC, 10);
			close((int)strtol(v, NULL, 10));
		}
		else usage();
	}
	if (!sock_path || !mode || !buffer || i >= argc) usage();
	/* Nothing the starter had open (its sockets, pipes, database) stays open in the holder, which
	 * lives in the sandbox's cgroup and outlives the starter: only stdio and the ready pipe. */
	close_inherited(ready_fd);
	if (!strcmp(mode, "pty")) mode_pty = 1;
	else if (strcmp(mode, "command")) fail("bad --mode: %s", mode);
	size_t il = strlen(info_json);
	if (il > INFO_MAX || il < 2 || info_json[0] != '{' || info_json[il - 1] != '}')
		fail("--info must be a JSON object of at most %d bytes", INFO_MAX);
	cap = buffer;
	chunk_max = cap / 4 > OUT_HDR + MAX_CHUNK ? MAX_CHUNK : cap / 4 - OUT_HDR;
	/* one read of stdout, stderr and status, plus a pipe's worth of each of
	 * stdout and stderr drained before a status line */
	read_margin = 3 * (OUT_HDR + chunk_max) + 2 * (65536 + 2 * OUT_HDR);
	if (read_margin > cap / 2) read_margin = cap / 2;

	/* Detach from the starter: own session, no terminal, immune to its death. */
	setsid();
	signal(SIGHUP, SIG_IGN);
	signal(SIGPIPE, SIG_IGN);
	int null = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (null >= 0) {
		dup2(null, 0); dup2(null, 1); dup2(null, 2);
		if (null > 2) close(null);
	}
	/* Orphans of the shell's tree come to us: we reap them and can still kill them. */
	prctl(PR_SET_CHILD_SUBREAPER, 1);

	{
		struct timespec ts;
		struct tm tm;
		clock_gettime(CLOCK_REALTIME, &ts);
		gmtime_r(&ts.tv_sec, &tm);
		size_t n = strftime(created_at, sizeof created_at, "%Y-%m-%dT%H:%M:%S", &tm);
		snprintf(created_at + n, sizeof created_at - n, ".%03ldZ", ts.tv_nsec / 1000000);
	}

	rb = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (rb == MAP_FAILED) fail("cannot map a %llu-byte buffer: %s", (unsigned long long)cap, strerror(errno));

	sigset_t ss;
	sigemptyset(&ss);
	sigaddset(&ss, SIGCHLD);
	sigaddset(&ss, SIGTERM);
	sigaddset(&ss, SIGINT);
	sigprocmask(SIG_BLOCK, &ss, NULL);
	sig_fd = signalfd(-1, &ss, SFD_NONBLOCK | SFD_CLOEXEC);
	if (sig_fd < 0) fail("signalfd: %s", strerror(errno));

	make_socket();
	spawn_child(argv + i);
	publish_socket();
	if (ready_fd >= 0) {
		dprintf(ready_fd, "ready %d %d\n", holder_pid, child_pid);
		close(ready_fd);
		ready_fd = -1;
	}

	struct pollfd pfd[8 + MAX_CLIENTS];
	for (;;) {
		int n = 0, i_listen = -1, i_sig, i_out = -1, i_err = -1, i_st = -1, i_pty = -1, i_in = -1, i_cl = 0;
		int64_t now = now_ms(), wake = 0;
		short rd = output_blocked(now, &wake) ? 0 : POLLIN;
		if (listen_fd >= 0) { i_listen = n; pfd[n++] = (struct pollfd){ listen_fd, POLLIN, 0 }; }
		i_sig = n; pfd[n++] = (struct pollfd){ sig_fd, POLLIN, 0 };
		if (mode_pty) {
			if (fd_pty >= 0 && (rd || ibuf_len)) {
				i_pty = n;
				pfd[n++] = (struct pollfd){ fd_pty, (short)(rd | (ibuf_len ? POLLOUT : 0)), 0 };
			}
		} else {
			if (fd_out >= 0 && rd) { i_out = n; pfd[n++] = (struct pollfd){ fd_out, POLLIN, 0 }; }
			if (fd_err >= 0 && rd) { i_err = n; pfd[n++] = (struct pollfd){ fd_err, POLLIN, 0 }; }
			if (fd_status >= 0 && rd) { i_st = n; pfd[n++] = (struct pollfd){ fd_status, POLLIN, 0 }; }
			if (fd_in >= 0 && ibuf_len) { i_in = n; pfd[n++] = (struct pollfd){ fd_in, POLLOUT, 0 }; }
		}
		i_cl = n;
		for (int k = 0; k < nclients; k++) {
			struct client *c = clients[k];
			short ev = 0;
			if (!c->stalled && !closing) ev |= POLLIN;
			if (client_has_pending(c)) ev |= POLLOUT;
			pfd[n++] = (struct pollfd){ c->fd, ev, 0 };
		}

		int64_t deadline = wake;
		if (closing) deadline = close_deadline;
		else if (linger_deadline && (!deadline || linger_deadline < deadline)) deadline = linger_deadline;
		int timeout = -1;
		if (deadline) timeout = deadline > now ? (int)(deadline - now) : 0;

		int r = poll(pfd, (nfds_t)n, timeout);
		if (r < 0 && errno != EINTR) fail("poll: %s", strerror(errno));
		if (r > 0) {
			if (pfd[i_sig].revents) {
				struct signalfd_siginfo si;
				while (read(sig_fd, &si, sizeof si) == sizeof si) {
					if (si.ssi_signo == SIGTERM || si.ssi_signo == SIGINT) start_close(NULL);
				}
				reap();
			}
			if (i_pty >= 0 && fd_pty >= 0 && pfd[i_pty].revents) {
				if (pfd[i_pty].revents & POLLOUT) input_flush();
				if (rd && fd_pty >= 0 && (pfd[i_pty].revents & (POLLIN | POLLHUP | POLLERR))) read_output(&fd_pty, S_PTY);
			}
			if (i_out >= 0 && pfd[i_out].revents) read_output(&fd_out, S_STDOUT);
			if (i_err >= 0 && pfd[i_err].revents) read_output(&fd_err, S_STDERR);
			if (i_st >= 0 && pfd[i_st].revents && fd_status >= 0) {
				/* Everything the command wrote before its status line is in the
				 * pipes now (at most one pipe's worth each): record it first. */
				drain(&fd_out, S_STDOUT, pipe_capacity(fd_out));
				drain(&fd_err, S_STDERR, pipe_capacity(fd_err));
				read_output(&fd_status, S_STATUS);
			}
			if (i_in >= 0 && pfd[i_in].revents) input_flush();
			for (int k = 0; k < nclients && i_cl + k < n; k++) {
				struct client *c = clients[k];
				short rev = pfd[i_cl + k].revents;
				if (rev & (POLLIN | POLLHUP | POLLERR)) {
					if (closing) { if (rev & (POLLHUP | POLLERR)) c->dead = 1; }
					else client_read(c);
				}
			}
			if (i_listen >= 0 && listen_fd >= 0 && pfd[i_listen].revents) accept_clients();
		}
		for (int k = 0; k < nclients; k++) client_flush(clients[k]);
		drop_dead_clients();

		now = now_ms();
		if (closing) {
			int busy = 0;
			for (int k = 0; k < nclients; k++) busy |= client_has_pending(clients[k]);
			if (!busy || now >= close_deadline) finish();
			continue;
		}
		if (child_reaped && nclients == 0) {
			if (!linger_deadline) linger_deadline = now + (int64_t)linger_ms;
			if (now >= linger_deadline) finish();
		} else {
			linger_deadline = 0;
		}
	}
}
