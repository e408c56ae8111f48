/* A closed-loop ext_proc load generator in C: bench/extproc_client.py's ClosedLoop, without Python.
 *
 * Why: the workers cell of bench/scaleout drives `epp --workers 2` on a 2-core machine, and the
 * Python client's ~9 us of CPU a request (0.18 of a core at 21k requests a second) is CPU the
 * workers cannot have; the ratio then measures the client as much as the EPP.  This program sends
 * the same bytes on the same schedule (bench/extproc_native.py writes them: the HPACK block, each
 * variant's two phases as gRPC messages, and the order of the variants) for a few instructions a
 * frame.
 *
 * Protocol on stdin/stdout, one line each way per run:
 *   stdin  "run <seconds>\n"   connect, keep <concurrency> streams open until <seconds> have
 *                              passed, let the open ones finish, close the connections;
 *   stdout "done <routed> <refused> <failed>\n", after writing the routed streams' latencies
 *          (seconds, native doubles) to <latencies path>;
 *   stdin EOF                  exit.
 * Usage: extproc_load <host> <port> <connections> <concurrency> <spec path> <latencies path>
 *
 * HTTP/2 as the Python client speaks it: preface, SETTINGS (window 2^31-1, no push) and a
 * connection WINDOW_UPDATE to 2^31-1, SETTINGS and PING ACKs, a WINDOW_UPDATE once a gigabyte has
 * been received.  GOAWAY drains the connection as HTTP/2 clients do (RFC 9113 §6.8): streams past
 * its last stream id fail, the others finish, and the streams that replace them open on a new
 * connection (the EPP's workers retire a connection this way to even out their share).  A
 * stream's first DATA
 * frame longer than the 5-byte gRPC prefix tells routed (any tag but 0x3a) from refused (0x3a,
 * immediate_response); routed streams then send their second phase with END_STREAM; a stream
 * ends on a frame with END_STREAM (its outcome stands) or a RST_STREAM (failed).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { DATA = 0, HEADERS = 1, RST_STREAM = 3, SETTINGS = 4, PING = 6, GOAWAY = 7, WINDOW_UPDATE = 8 };
enum { END_STREAM = 0x1, ACK = 0x1, END_HEADERS = 0x4 };
enum { ROUTED = 0, REFUSED = 1, FAILED = 2 };

typedef struct {
    const unsigned char *p;
    uint32_t n;
} bytes_t;

typedef struct {
    uint32_t sid;
    uint32_t variant;
    int replied;
    int status;
    double started;
} stream_t;

typedef struct conn {
    int fd;
    int closing;
    int draining;            /* GOAWAY read: no new stream here, the open ones finish */
    int watching_out;        /* EPOLLOUT in the interest set */
    struct conn *successor;  /* where a draining connection's replacement streams open */
    unsigned char *in;
    size_t in_len, in_cap;
    unsigned char *out;
    size_t out_len, out_cap;
    stream_t *streams;
    size_t n_streams, cap_streams;
    uint32_t next_id;
    uint64_t recv_unacked;
} conn_t;

static const char *dial_host, *dial_port;
static int epfd = -1;
static conn_t **all;  /* every connection of the run, the drained ones included */
static size_t n_all, cap_all;

static bytes_t block;           /* the request headers' HPACK block, valid on every stream */
static bytes_t *phase1, *phase2; /* per variant */
static uint32_t *order;         /* the variants' order, cycled */
static uint32_t n_order, next_order;
static double deadline;
static long counts[3];
static double *lat;
static size_t n_lat, cap_lat;
static int open_streams;

static void die(const char *what) {
    perror(what);
    exit(2);
}

static void *xrealloc(void *p, size_t n) {
    void *q = realloc(p, n);
    if (!q) die("realloc");
    return q;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void out_put(conn_t *c, const void *p, size_t n) {
    if (c->out_len + n > c->out_cap) {
        c->out_cap = (c->out_len + n) * 2;
        c->out = xrealloc(c->out, c->out_cap);
    }
    memcpy(c->out + c->out_len, p, n);
    c->out_len += n;
}

static void out_frame(conn_t *c, int kind, int flags, uint32_t sid, const void *payload, uint32_t n) {
    unsigned char h[9] = {(unsigned char)(n >> 16), (unsigned char)(n >> 8), (unsigned char)n,
                          (unsigned char)kind, (unsigned char)flags,
                          (unsigned char)(sid >> 24), (unsigned char)(sid >> 16),
                          (unsigned char)(sid >> 8), (unsigned char)sid};
    out_put(c, h, 9);
    if (n) out_put(c, payload, n);
}

static void start_stream(conn_t *c, double t) {
    uint32_t v = order[next_order];
    next_order = (next_order + 1) % n_order;
    if (c->n_streams == c->cap_streams) {
        c->cap_streams = c->cap_streams ? c->cap_streams * 2 : 16;
        c->streams = xrealloc(c->streams, c->cap_streams * sizeof(stream_t));
    }
    stream_t *s = &c->streams[c->n_streams++];
    s->sid = c->next_id;
    s->variant = v;
    s->replied = 0;
    s->status = FAILED;
    s->started = t;
    c->next_id += 2;
    out_frame(c, HEADERS, END_HEADERS, s->sid, block.p, block.n);
    out_frame(c, DATA, 0, s->sid, phase1[v].p, phase1[v].n);
}

static void record(int status, double started, double t) {
    counts[status]++;
    if (status == ROUTED) {
        if (n_lat == cap_lat) {
            cap_lat = cap_lat ? cap_lat * 2 : 65536;
            lat = xrealloc(lat, cap_lat * sizeof(double));
        }
        lat[n_lat++] = t - started;
    }
}

static conn_t *open_conn(void);

/* Where a stream replacing one of c's opens: c, or once c drains, the connection after it. */
static conn_t *live(conn_t *c) {
    while (c->draining) {
        if (!c->successor) c->successor = open_conn();
        c = c->successor;
    }
    return c;
}

/* The stream at index i ended with status: count it, and replace it while the run lasts. */
static void end_stream(conn_t *c, size_t i, int status) {
    double t = now();
    record(status, c->streams[i].started, t);
    c->streams[i] = c->streams[--c->n_streams];
    if (t < deadline && !c->closing) {
        start_stream(live(c), t);
    } else {
        open_streams--;
    }
}

static long find(conn_t *c, uint32_t sid) {
    for (size_t i = 0; i < c->n_streams; i++)
        if (c->streams[i].sid == sid) return (long)i;
    return -1;
}

static void close_conn(conn_t *c) {
    if (c->fd < 0) return;
    close(c->fd);
    c->fd = -1;
    c->closing = 1;
    double t = now();
    while (c->n_streams) {
        stream_t *s = &c->streams[--c->n_streams];
        record(FAILED, s->started, t);
        open_streams--;
    }
}

static void flush(conn_t *c) {
    size_t done = 0;
    while (done < c->out_len && c->fd >= 0) {
        ssize_t w = write(c->fd, c->out + done, c->out_len - done);
        if (w > 0) {
            done += (size_t)w;
        } else if (w < 0 && errno == EINTR) {
            continue;
        } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            break; /* the rest goes when the socket is writable again */
        } else {
            close_conn(c);
            c->out_len = 0;
            return;
        }
    }
    memmove(c->out, c->out + done, c->out_len - done);
    c->out_len -= done;
}

static void on_frames(conn_t *c) {
    size_t pos = 0, n = c->in_len;
    unsigned char *b = c->in;
    uint64_t received = 0;
    while (n - pos >= 9) {
        uint32_t len = (uint32_t)b[pos] << 16 | (uint32_t)b[pos + 1] << 8 | b[pos + 2];
        int kind = b[pos + 3], flags = b[pos + 4];
        uint32_t sid = ((uint32_t)b[pos + 5] << 24 | (uint32_t)b[pos + 6] << 16 |
                        (uint32_t)b[pos + 7] << 8 | b[pos + 8]) & 0x7FFFFFFFu;
        size_t end = pos + 9 + len;
        if (end > n) break;
        if (kind == DATA) {
            received += len;
            long i = find(c, sid);
            if (i >= 0) {
                stream_t *s = &c->streams[i];
                if (!s->replied && len > 5) {
                    s->replied = 1;
                    if (b[pos + 14] == 0x3A) {
                        s->status = REFUSED;
                    } else {
                        s->status = ROUTED;
                        bytes_t p2 = phase2[s->variant];
                        out_frame(c, DATA, END_STREAM, sid, p2.p, p2.n);
                    }
                }
                if (flags & END_STREAM) end_stream(c, (size_t)i, s->status);
            }
        } else if (kind == HEADERS) {
            if (flags & END_STREAM) {
                long i = find(c, sid);
                if (i >= 0) end_stream(c, (size_t)i, c->streams[i].status);
            }
        } else if (kind == RST_STREAM) {
            long i = find(c, sid);
            if (i >= 0) end_stream(c, (size_t)i, FAILED);
        } else if (kind == SETTINGS) {
            if (!(flags & ACK)) out_frame(c, SETTINGS, ACK, 0, NULL, 0);
        } else if (kind == PING) {
            if (!(flags & ACK)) out_frame(c, PING, ACK, 0, b + pos + 9, len);
        } else if (kind == GOAWAY && len >= 8) {
            uint32_t last = ((uint32_t)b[pos + 9] << 24 | (uint32_t)b[pos + 10] << 16 |
                             (uint32_t)b[pos + 11] << 8 | b[pos + 12]) & 0x7FFFFFFFu;
            c->draining = 1;
            for (size_t k = c->n_streams; k-- > 0;)
                if (c->streams[k].sid > last) end_stream(c, k, FAILED); /* never processed */
        }
        pos = end;
    }
    memmove(b, b + pos, n - pos);
    c->in_len = n - pos;
    c->recv_unacked += received;
    if (c->recv_unacked > (1u << 30)) {
        uint32_t inc = htonl((uint32_t)c->recv_unacked);
        out_frame(c, WINDOW_UPDATE, 0, 0, &inc, 4);
        c->recv_unacked = 0;
    }
}

static int fcntl_nonblock(int fd) {
    int fl = fcntl(fd, F_GETFL, 0);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static int dial(const char *host, const char *port) {
    struct addrinfo hints = {0}, *res;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, port, &hints, &res) != 0) die("getaddrinfo");
    int fd = socket(res->ai_family, SOCK_STREAM, 0);
    if (fd < 0) die("socket");
    if (connect(fd, res->ai_addr, res->ai_addrlen) < 0) die("connect");
    freeaddrinfo(res);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (fcntl_nonblock(fd) < 0) die("fcntl");
    return fd;
}

static unsigned char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) die(path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *p = xrealloc(NULL, (size_t)n);
    if (fread(p, 1, (size_t)n, f) != (size_t)n) die("fread");
    fclose(f);
    *len = (size_t)n;
    return p;
}

static uint32_t take_u32(const unsigned char **p) {
    uint32_t v;
    memcpy(&v, *p, 4); /* little-endian, as bench/extproc_native.py writes it */
    *p += 4;
    return v;
}

static bytes_t take_bytes(const unsigned char **p) {
    bytes_t b;
    b.n = take_u32(p);
    b.p = *p;
    *p += b.n;
    return b;
}

/* spec: u32 variants, header block, then per variant phase 1 and phase 2 (each u32 length +
 * bytes), then u32 order length and that many u32 variant indices. */
static void load_spec(const char *path) {
    size_t len;
    const unsigned char *p = read_file(path, &len);
    uint32_t n = take_u32(&p);
    block = take_bytes(&p);
    phase1 = xrealloc(NULL, n * sizeof(bytes_t));
    phase2 = xrealloc(NULL, n * sizeof(bytes_t));
    for (uint32_t i = 0; i < n; i++) {
        phase1[i] = take_bytes(&p);
        phase2[i] = take_bytes(&p);
    }
    n_order = take_u32(&p);
    order = xrealloc(NULL, n_order * sizeof(uint32_t));
    for (uint32_t i = 0; i < n_order; i++) {
        order[i] = take_u32(&p);
        if (order[i] >= n) {
            fprintf(stderr, "spec: variant %u of %u\n", order[i], n);
            exit(2);
        }
    }
}

/* A new connection of the run: connected, preface and settings queued, watched for reads. */
static conn_t *open_conn(void) {
    static const unsigned char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    conn_t *c = calloc(1, sizeof(conn_t));
    if (!c) die("calloc");
    c->fd = dial(dial_host, dial_port);
    c->next_id = 1;
    c->in_cap = 1 << 16;
    c->in = xrealloc(NULL, c->in_cap);
    out_put(c, preface, sizeof preface - 1);
    unsigned char settings[12] = {0, 4, 0x7F, 0xFF, 0xFF, 0xFF, 0, 2, 0, 0, 0, 0};
    out_frame(c, SETTINGS, 0, 0, settings, sizeof settings);
    uint32_t inc = htonl(0x7FFFFFFFu - 65535u);
    out_frame(c, WINDOW_UPDATE, 0, 0, &inc, 4);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
    if (epoll_ctl(epfd, EPOLL_CTL_ADD, c->fd, &ev) < 0) die("epoll_ctl");
    if (n_all == cap_all) {
        cap_all = cap_all ? cap_all * 2 : 16;
        all = xrealloc(all, cap_all * sizeof(conn_t *));
    }
    all[n_all++] = c;
    return c;
}

static void run(const char *host, const char *port, int nconn, int concurrency, double seconds) {
    dial_host = host;
    dial_port = port;
    epfd = epoll_create1(0);
    if (epfd < 0) die("epoll_create1");
    n_all = 0;
    for (int i = 0; i < nconn; i++) open_conn();
    memset(counts, 0, sizeof counts);
    n_lat = 0;
    next_order = 0;
    double t0 = now();
    deadline = t0 + seconds;
    double give_up = deadline + 30.0;
    open_streams = concurrency;
    for (int i = 0; i < concurrency; i++) start_stream(all[i % nconn], t0);

    struct epoll_event evs[64];
    while (open_streams > 0 && now() < give_up) {
        /* what the last wake wrote, on any connection (a replacement may open on a successor) */
        for (size_t i = 0; i < n_all; i++) {
            conn_t *c = all[i];
            if (c->fd < 0) continue;
            if (c->out_len) flush(c);
            if (c->fd < 0) continue;
            if (c->closing || (c->draining && !c->n_streams)) { /* drained: nothing is lost */
                close_conn(c);
                continue;
            }
            int want_out = c->out_len > 0;
            if (want_out != c->watching_out) {
                struct epoll_event ev = {.events = EPOLLIN | (want_out ? EPOLLOUT : 0), .data.ptr = c};
                epoll_ctl(epfd, EPOLL_CTL_MOD, c->fd, &ev);
                c->watching_out = want_out;
            }
        }
        int k = epoll_wait(epfd, evs, 64, 1000);
        if (k < 0 && errno != EINTR) die("epoll_wait");
        for (int e = 0; e < k; e++) {
            conn_t *c = evs[e].data.ptr;
            if (c->fd < 0) continue;
            if (evs[e].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) {
                for (;;) {
                    if (c->in_cap - c->in_len < 16384) {
                        c->in_cap *= 2;
                        c->in = xrealloc(c->in, c->in_cap);
                    }
                    ssize_t r = read(c->fd, c->in + c->in_len, c->in_cap - c->in_len);
                    if (r > 0) {
                        c->in_len += (size_t)r;
                        if ((size_t)r < 16384) break; /* drained (edge cases read again next wake) */
                    } else if (r < 0 && errno == EINTR) {
                        continue;
                    } else if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                        break;
                    } else {
                        on_frames(c);
                        close_conn(c);
                        break;
                    }
                }
                if (c->fd >= 0) on_frames(c);
            }
        }
    }
    for (size_t i = 0; i < n_all; i++) {
        close_conn(all[i]); /* streams still open past give_up count as failed */
        free(all[i]->in);
        free(all[i]->out);
        free(all[i]->streams);
        free(all[i]);
    }
    n_all = 0;
    close(epfd);
}

static void write_latencies(const char *path) {
    FILE *f = fopen(path, "wb");
    if (!f) die(path);
    if (n_lat && fwrite(lat, sizeof(double), n_lat, f) != n_lat) die("fwrite");
    fclose(f);
}

int main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: %s host port connections concurrency spec latencies\n", argv[0]);
        return 2;
    }
    int nconn = atoi(argv[3]), concurrency = atoi(argv[4]);
    if (nconn < 1 || concurrency < 1) {
        fprintf(stderr, "connections and concurrency must be >= 1\n");
        return 2;
    }
    load_spec(argv[5]);
    char line[128];
    while (fgets(line, sizeof line, stdin)) {
        double seconds;
        if (sscanf(line, "run %lf", &seconds) != 1) {
            fprintf(stderr, "expected 'run <seconds>', got: %s", line);
            return 2;
        }
        run(argv[1], argv[2], nconn, concurrency, seconds);
        write_latencies(argv[6]);
        printf("done %ld %ld %ld\n", counts[ROUTED], counts[REFUSED], counts[FAILED]);
        fflush(stdout);
    }
    return 0;
}
