/* The TLS client of benchmarks/loadgen and benchmarks/wsload (-S), over OpenSSL 3 (Debian: libssl-dev; link with
 * -lssl -lcrypto). Benchmark servers make their certificates at start, so the server's certificate is not verified;
 * ALPN offers http/1.1 only (Kestrel also offers h2, and neither tool speaks it: a WebSocket upgrade needs HTTP/1.1);
 * no session is kept or offered again, so every handshake is a full one. TLS 1.2 or 1.3, as OpenSSL negotiates. */
#ifndef KTL_BENCH_TLS_H
#define KTL_BENCH_TLS_H

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

// The client context both tools share, or NULL when OpenSSL could not make it.
static SSL_CTX *tls_client_context(void)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx)
        return NULL;
    SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET);
    static const unsigned char alpn[] = "\x08http/1.1";
    if (SSL_CTX_set_alpn_protos(ctx, alpn, sizeof alpn - 1) != 0) {   // 0 is success here
        SSL_CTX_free(ctx);
        return NULL;
    }
    return ctx;
}

// Why an SSL call failed, given what SSL_get_error said of it (call this before errno can change): OpenSSL's
// first queued error ("error:0A00010B:SSL routines::wrong version number"), else the socket's.
static const char *tls_error_text(int ssl_error, char *text, size_t size)
{
    int saved = errno;
    unsigned long e = ERR_peek_error();
    if (e) {
        ERR_error_string_n(e, text, size);
        return text;
    }
    if (ssl_error == SSL_ERROR_SYSCALL && saved != 0)
        return strerror(saved);
    if (ssl_error == SSL_ERROR_SYSCALL || ssl_error == SSL_ERROR_ZERO_RETURN)
        return "the server closed the connection";
    snprintf(text, size, "SSL_get_error %d", ssl_error);
    return text;
}

#endif
