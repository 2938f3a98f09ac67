using System.Text;

namespace TechEmpower.Platform;

/// <summary>What the platform handler does with a request.</summary>
public enum RequestVerdict
{
    /// <summary>A well-formed GET without a body: answer it by <see cref="HttpRequestHead.Route"/>.</summary>
    Serve,

    /// <summary>A well-formed request with another method: 405, and the connection stays open.</summary>
    MethodNotAllowed,

    /// <summary>Malformed, or with a body this handler does not read: 400, then close.</summary>
    BadRequest,
}

/// <summary>The paths the platform handler knows.</summary>
public enum PlatformRoute
{
    /// <summary>Any other path: 404.</summary>
    NotFound,

    /// <summary><c>/plaintext</c>.</summary>
    Plaintext,

    /// <summary><c>/json</c>.</summary>
    Json,
}

/// <summary>
/// The request line and headers of one HTTP/1.x request, parsed as strictly as RFC 9112 asks of a
/// server but only as far as the platform handler needs: the method, the path, whether the
/// connection stays open, and whether a body follows (which this handler refuses).
/// </summary>
public readonly struct HttpRequestHead
{
    private HttpRequestHead(RequestVerdict verdict, PlatformRoute route, bool keepAlive)
    {
        Verdict = verdict;
        Route = route;
        KeepAlive = keepAlive;
    }

    /// <summary>What to do with the request.</summary>
    public RequestVerdict Verdict { get; }

    /// <summary>The path, when <see cref="Verdict"/> is <see cref="RequestVerdict.Serve"/>.</summary>
    public PlatformRoute Route { get; }

    /// <summary>Whether the connection stays open after the response.</summary>
    public bool KeepAlive { get; }

    private static HttpRequestHead Bad => new(RequestVerdict.BadRequest, PlatformRoute.NotFound, keepAlive: false);

    private static ReadOnlySpan<byte> Crlf => "\r\n"u8;

    /// <summary>Parses a request head.</summary>
    /// <param name="head">
    /// The bytes from the request line up to, not including, the empty line: lines separated by CRLF,
    /// with no CRLF after the last one.
    /// </param>
    /// <returns>The parsed head; <see cref="RequestVerdict.BadRequest"/> for anything malformed.</returns>
    public static HttpRequestHead Parse(ReadOnlySpan<byte> head)
    {
        var lineEnd = head.IndexOf(Crlf);
        var requestLine = lineEnd < 0 ? head : head[..lineEnd];
        var headers = lineEnd < 0 ? [] : head[(lineEnd + 2)..];

        if (!TryParseRequestLine(requestLine, out var isGet, out var route, out var isHttp11))
        {
            return Bad;
        }

        var keepAlive = isHttp11;
        var hostCount = 0;
        while (lineEnd >= 0)
        {
            lineEnd = headers.IndexOf(Crlf);
            var line = lineEnd < 0 ? headers : headers[..lineEnd];
            headers = lineEnd < 0 ? [] : headers[(lineEnd + 2)..];

            var colon = line.IndexOf((byte)':');
            if (colon <= 0 || !IsToken(line[..colon]))
            {
                // No name, whitespace before the colon (RFC 9112 5.1), or a folded line (5.2).
                return Bad;
            }

            var name = line[..colon];
            var value = line[(colon + 1)..].Trim(" \t"u8);
            if (!IsFieldValue(value))
            {
                return Bad;
            }

            if (name.Length == 4 && Ascii.EqualsIgnoreCase(name, "Host"u8))
            {
                hostCount++;
            }
            else if (name.Length == 17 && Ascii.EqualsIgnoreCase(name, "Transfer-Encoding"u8))
            {
                return Bad;
            }
            else if (name.Length == 14 && Ascii.EqualsIgnoreCase(name, "Content-Length"u8))
            {
                // Only an explicit empty body is acceptable: this handler never reads one.
                if (value.Length == 0 || value.IndexOfAnyExcept((byte)'0') >= 0)
                {
                    return Bad;
                }
            }
            else if (name.Length == 10 && Ascii.EqualsIgnoreCase(name, "Connection"u8))
            {
                if (HasToken(value, "close"u8))
                {
                    keepAlive = false;
                }
                else if (!isHttp11 && HasToken(value, "keep-alive"u8))
                {
                    keepAlive = true;
                }
            }
        }

        // RFC 9112 3.2: an HTTP/1.1 request without exactly one Host header gets 400.
        if (isHttp11 ? hostCount != 1 : hostCount > 1)
        {
            return Bad;
        }

        return isGet
            ? new HttpRequestHead(RequestVerdict.Serve, route, keepAlive)
            : new HttpRequestHead(RequestVerdict.MethodNotAllowed, PlatformRoute.NotFound, keepAlive);
    }

    /// <summary>
    /// Whether the start of a request that has not fully arrived can still become a valid one: the
    /// request line is checked as soon as its CRLF is there, and the method's characters before
    /// that, so a TLS handshake or a stray binary protocol gets its 400 at once.
    /// </summary>
    /// <param name="start">The bytes received so far.</param>
    /// <returns>False when no continuation could make the request valid.</returns>
    public static bool IsPlausibleStart(ReadOnlySpan<byte> start)
    {
        var lineEnd = start.IndexOf(Crlf);
        if (lineEnd >= 0)
        {
            return TryParseRequestLine(start[..lineEnd], out _, out _, out _);
        }

        // A lone CR may be the first half of the line's CRLF; any other control byte is not.
        var partial = start.Length > 0 && start[^1] == '\r' ? start[..^1] : start;
        var space = partial.IndexOf((byte)' ');
        var method = space < 0 ? partial : partial[..space];
        return (method.Length == 0 && space < 0) || (method.Length > 0 && IsToken(method) && !partial.ContainsAny("\r\n"u8));
    }

    private static bool TryParseRequestLine(ReadOnlySpan<byte> line, out bool isGet, out PlatformRoute route, out bool isHttp11)
    {
        isGet = false;
        route = PlatformRoute.NotFound;
        isHttp11 = false;

        // method SP request-target SP HTTP-version, single spaces (RFC 9112 3).
        var firstSpace = line.IndexOf((byte)' ');
        if (firstSpace <= 0 || !IsToken(line[..firstSpace]))
        {
            return false;
        }

        var rest = line[(firstSpace + 1)..];
        var secondSpace = rest.IndexOf((byte)' ');
        if (secondSpace <= 0)
        {
            return false;
        }

        var target = rest[..secondSpace];
        var version = rest[(secondSpace + 1)..];

        // origin-form only: absolute-form and authority-form are for proxies and CONNECT.
        if (target[0] != '/' || target.IndexOfAnyExceptInRange((byte)0x21, (byte)0x7E) >= 0)
        {
            return false;
        }

        if (version.SequenceEqual("HTTP/1.1"u8))
        {
            isHttp11 = true;
        }
        else if (!version.SequenceEqual("HTTP/1.0"u8))
        {
            return false;
        }

        isGet = line[..firstSpace].SequenceEqual("GET"u8);

        var query = target.IndexOf((byte)'?');
        var path = query < 0 ? target : target[..query];
        route = path.SequenceEqual("/plaintext"u8) ? PlatformRoute.Plaintext
            : path.SequenceEqual("/json"u8) ? PlatformRoute.Json
            : PlatformRoute.NotFound;
        return true;
    }

    // token = 1*tchar (RFC 9110 5.6.2).
    private static bool IsToken(ReadOnlySpan<byte> value)
    {
        if (value.IsEmpty)
        {
            return false;
        }

        foreach (var b in value)
        {
            var isTchar = b is (>= (byte)'a' and <= (byte)'z') or (>= (byte)'A' and <= (byte)'Z') or (>= (byte)'0' and <= (byte)'9')
                or (byte)'!' or (byte)'#' or (byte)'$' or (byte)'%' or (byte)'&' or (byte)'\'' or (byte)'*'
                or (byte)'+' or (byte)'-' or (byte)'.' or (byte)'^' or (byte)'_' or (byte)'`' or (byte)'|' or (byte)'~';
            if (!isTchar)
            {
                return false;
            }
        }

        return true;
    }

    // field-value: visible characters, obs-text, spaces and tabs; never CR, LF, NUL or other controls (RFC 9110 5.5).
    private static bool IsFieldValue(ReadOnlySpan<byte> value)
    {
        foreach (var b in value)
        {
            if ((b < 0x20 && b != '\t') || b == 0x7F)
            {
                return false;
            }
        }

        return true;
    }

    // Whether a comma-separated header value lists the token, case-insensitively.
    private static bool HasToken(ReadOnlySpan<byte> value, ReadOnlySpan<byte> token)
    {
        foreach (var range in value.Split((byte)','))
        {
            if (Ascii.EqualsIgnoreCase(value[range].Trim(" \t"u8), token))
            {
                return true;
            }
        }

        return false;
    }
}
