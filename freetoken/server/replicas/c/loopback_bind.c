/* LD_PRELOAD shim for `serve --replicas N --host <loopback>`: Ray's daemons (GCS, raylet,
 * object manager, workers, agents) open their gRPC and HTTP ports on every interface and
 * offer no option to bind elsewhere. Loaded into every process of a local Ray instance, this
 * bind() moves any TCP listening address that is not loopback to loopback, port unchanged:
 * IPv4 to 127.0.0.1, an IPv6 socket to ::ffff:127.0.0.1 (a dual-stack socket then takes
 * IPv4 loopback only, which Ray's clients dial: the node IP is 127.0.0.1), or ::1 where the
 * socket is IPv6-only. UDP and Unix sockets are left alone. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);

static int is_tcp(int fd) {
    int type = 0;
    socklen_t n = sizeof type;
    return getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &n) == 0 && type == SOCK_STREAM;
}

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    static bind_fn real;
    if (!real)
        real = (bind_fn)dlsym(RTLD_NEXT, "bind");
    if (!addr || !is_tcp(fd))
        return real(fd, addr, len);
    if (addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        struct sockaddr_in a;
        memcpy(&a, addr, sizeof a);
        if ((ntohl(a.sin_addr.s_addr) >> 24) == 127)
            return real(fd, addr, len);
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        return real(fd, (const struct sockaddr *)&a, sizeof a);
    }
    if (addr->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 a;
        memcpy(&a, addr, sizeof a);
        const unsigned char *b = a.sin6_addr.s6_addr;
        if (IN6_IS_ADDR_LOOPBACK(&a.sin6_addr) || (IN6_IS_ADDR_V4MAPPED(&a.sin6_addr) && b[12] == 127))
            return real(fd, addr, len);
        memset(&a.sin6_addr, 0, sizeof a.sin6_addr);
        a.sin6_addr.s6_addr[10] = a.sin6_addr.s6_addr[11] = 0xff;
        a.sin6_addr.s6_addr[12] = 127;
        a.sin6_addr.s6_addr[15] = 1;
        int r = real(fd, (const struct sockaddr *)&a, sizeof a);
        if (r == 0 || (errno != EINVAL && errno != EAFNOSUPPORT))
            return r;
        a.sin6_addr = in6addr_loopback;          /* an IPv6-only socket */
        return real(fd, (const struct sockaddr *)&a, sizeof a);
    }
    return real(fd, addr, len);
}
