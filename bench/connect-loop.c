// SPDX-License-Identifier: Apache-2.0
/*
 * connect() in a loop, for bench/egress.ts (npm run bench:egress). Built at bench
 * time with `cc -O2`.
 *
 *   connect-loop listen PORT
 *       Accept and close TCP connections on 0.0.0.0:PORT (0: any free port) until
 *       killed. Prints "listening PORT" once ready.
 *
 *   connect-loop compare FILTERED_CGROUP UNFILTERED_CGROUP tcp|udp ADDR PORT COUNT ok|eperm
 *       COUNT (rounded up to a multiple of BATCH) timed iterations of socket() +
 *       connect() + close() to ADDR:PORT in each of two cgroup2 groups, one with the
 *       egress programs attached and one without, in batches of BATCH that alternate
 *       between the groups (the process moves itself; a socket belongs to the cgroup
 *       its creator was in), after COUNT/10 untimed warm-up iterations in each. On a
 *       shared, busy host this measures both sides milliseconds apart, so load from
 *       elsewhere hits them alike.
 *       Every connect() must have the expected outcome: success unfiltered, and
 *       success or EPERM (the last argument) filtered; the first one that does not
 *       ends the run with status 2. Each iteration is timed on CLOCK_MONOTONIC.
 *       Prints one JSON line:
 *       {"filtered":{"count":..,"p50_ns":..,"p99_ns":..,"mean_ns":..},"unfiltered":{...}}
 *
 * TCP sockets close with SO_LINGER {on, 0}: a RST instead of a FIN, so no
 * TIME_WAIT entry is left per iteration (tens of thousands of them would exhaust
 * the ephemeral ports, and tcp_tw_reuse only covers 127/8). The timed iteration
 * includes everything the programs see: connect4 at connect(), and cgroup_skb
 * egress for the SYN, the ACK and the RST.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define LISTEN_BACKLOG 4096
#define BATCH 1000 /* connects per group before switching to the other */

static void die(const char *what)
{
	fprintf(stderr, "connect-loop: %s: %s\n", what, strerror(errno));
	exit(1);
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int compare_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static _Noreturn void listen_forever(int port)
{
	struct sockaddr_in addr = { .sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_ANY) };
	socklen_t len = sizeof(addr);
	int one = 1;
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd < 0)
		die("socket");
	if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0)
		die("SO_REUSEADDR");
	if (bind(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0)
		die("bind");
	if (listen(fd, LISTEN_BACKLOG) < 0)
		die("listen");
	if (getsockname(fd, (struct sockaddr *)&addr, &len) < 0)
		die("getsockname");
	printf("listening %d\n", ntohs(addr.sin_port));
	fflush(stdout);
	for (;;) {
		int conn = accept4(fd, NULL, NULL, SOCK_CLOEXEC);

		if (conn >= 0)
			close(conn);
		else if (errno != EINTR && errno != ECONNABORTED && errno != EMFILE && errno != ENFILE)
			die("accept");
	}
}

/* One socket() + connect() + close(); returns 0 or the errno of connect(). */
static int connect_once(int type, const struct sockaddr_in *dest)
{
	static const struct linger reset_on_close = { .l_onoff = 1, .l_linger = 0 };
	int fd = socket(AF_INET, type | SOCK_CLOEXEC, 0);
	int err = 0;

	if (fd < 0)
		die("socket");
	if (type == SOCK_STREAM && setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset_on_close, sizeof(reset_on_close)) < 0)
		die("SO_LINGER");
	if (connect(fd, (const struct sockaddr *)dest, sizeof(*dest)) < 0)
		err = errno;
	close(fd);
	return err;
}

/* Move this process into a cgroup2 group; its next sockets belong to that group. */
static void enter_cgroup(const char *dir)
{
	char path[4096];
	FILE *procs;

	snprintf(path, sizeof(path), "%s/cgroup.procs", dir);
	procs = fopen(path, "w");
	if (procs == NULL || fprintf(procs, "%d\n", getpid()) < 0 || fclose(procs) != 0) {
		fprintf(stderr, "connect-loop: entering %s: %s\n", dir, strerror(errno));
		exit(1);
	}
}

struct group {
	const char *name;
	const char *cgroup_dir;
	int expected_errno;
	uint64_t *samples;
	long done;
	uint64_t total_ns;
};

/* `count` connects in this process's current cgroup; timed ones go to g->samples. */
static void run_batch(struct group *g, int type, const struct sockaddr_in *dest, long count, int timed)
{
	for (long i = 0; i < count; i++) {
		uint64_t start = now_ns();
		int err = connect_once(type, dest);
		uint64_t elapsed = now_ns() - start;

		if (err != g->expected_errno) {
			fprintf(stderr, "connect-loop: %s group: connect to %s:%d: expected %s, got %s\n", g->name,
				inet_ntoa(dest->sin_addr), ntohs(dest->sin_port),
				g->expected_errno ? strerror(g->expected_errno) : "success", err ? strerror(err) : "success");
			exit(2);
		}
		if (timed) {
			g->samples[g->done++] = elapsed;
			g->total_ns += elapsed;
		}
	}
}

static void print_stats(const struct group *g)
{
	qsort(g->samples, g->done, sizeof(*g->samples), compare_u64);
	printf("\"%s\":{\"count\":%ld,\"p50_ns\":%llu,\"p99_ns\":%llu,\"mean_ns\":%llu}", g->name, g->done,
	       (unsigned long long)g->samples[(g->done - 1) / 2],
	       (unsigned long long)g->samples[(g->done * 99 + 99) / 100 - 1],
	       (unsigned long long)(g->total_ns / g->done));
}

static int compare_groups(int type, struct group groups[2], const char *host, int port, long count)
{
	struct sockaddr_in dest = { .sin_family = AF_INET, .sin_port = htons(port) };
	long batches = (count + BATCH - 1) / BATCH;

	if (inet_pton(AF_INET, host, &dest.sin_addr) != 1) {
		fprintf(stderr, "connect-loop: not an IPv4 address: %s\n", host);
		return 64;
	}
	for (int g = 0; g < 2; g++) {
		groups[g].samples = calloc(batches * BATCH, sizeof(uint64_t));
		if (groups[g].samples == NULL)
			die("calloc");
		enter_cgroup(groups[g].cgroup_dir);
		run_batch(&groups[g], type, &dest, count / 10, 0);
	}
	/* ABBA: the order flips every pair, so a linear drift hits both groups alike. */
	for (long b = 0; b < batches; b++) {
		for (int k = 0; k < 2; k++) {
			struct group *g = &groups[(b + k) % 2];

			enter_cgroup(g->cgroup_dir);
			run_batch(g, type, &dest, BATCH, 1);
		}
	}
	printf("{");
	print_stats(&groups[0]);
	printf(",");
	print_stats(&groups[1]);
	printf("}\n");
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "listen") == 0)
		listen_forever(atoi(argv[2]));
	if (argc == 9 && strcmp(argv[1], "compare") == 0 && (strcmp(argv[4], "tcp") == 0 || strcmp(argv[4], "udp") == 0) &&
	    (strcmp(argv[8], "ok") == 0 || strcmp(argv[8], "eperm") == 0) && atol(argv[7]) > 0) {
		struct group groups[2] = {
			{ .name = "filtered", .cgroup_dir = argv[2], .expected_errno = strcmp(argv[8], "eperm") == 0 ? EPERM : 0 },
			{ .name = "unfiltered", .cgroup_dir = argv[3], .expected_errno = 0 },
		};

		return compare_groups(strcmp(argv[4], "tcp") == 0 ? SOCK_STREAM : SOCK_DGRAM, groups, argv[5], atoi(argv[6]),
				      atol(argv[7]));
	}
	fprintf(stderr, "usage: connect-loop listen PORT\n"
			"       connect-loop compare FILTERED_CGROUP UNFILTERED_CGROUP tcp|udp ADDR PORT COUNT ok|eperm\n");
	return 64;
}
