/* The server address of benchmarks/loadgen and benchmarks/wsload: a numeric IPv4 or IPv6 address and a port,
 * as connect() takes it and as an HTTP Host header names it ("127.0.0.1:8080", "[::1]:8080").
 * Returns 0, or -1 when the address is not numeric. */
#ifndef KTL_BENCH_TARGET_H
#define KTL_BENCH_TARGET_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

static int parse_target(const char *address, int port, struct sockaddr_storage *target, socklen_t *target_len,
                        char *host, size_t host_size)
{
    memset(target, 0, sizeof *target);
    struct sockaddr_in *v4 = (struct sockaddr_in *)target;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)target;
    if (inet_pton(AF_INET, address, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons((uint16_t)port);
        *target_len = sizeof *v4;
        snprintf(host, host_size, "%s:%d", address, port);
        return 0;
    }
    if (inet_pton(AF_INET6, address, &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons((uint16_t)port);
        *target_len = sizeof *v6;
        snprintf(host, host_size, "[%s]:%d", address, port);
        return 0;
    }
    return -1;
}

#endif
