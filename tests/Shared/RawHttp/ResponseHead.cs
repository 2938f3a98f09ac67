using System.Globalization;

namespace RawHttp;

/// <summary>How the body of a response is delimited (RFC 9112, section 6.3).</summary>
public enum BodyFraming
{
    /// <summary>No body: a 1xx, 204 or 304 response, whatever its headers say.</summary>
    None,

    /// <summary>Exactly <see cref="ResponseHead.ContentLength"/> bytes.</summary>
    ContentLength,

    /// <summary><c>Transfer-Encoding: chunked</c>.</summary>
    Chunked,

    /// <summary>Neither length nor chunks: the body runs until the server closes the connection.</summary>
    UntilClose,
}

/// <summary>
/// The status line and header fields of one HTTP/1.1 response, as sent. Parsing is strict on purpose:
/// these clients check servers, so anything a correct server would not send is an
/// <see cref="InvalidDataException"/>, not something to work around.
/// </summary>
public sealed class ResponseHead
{
    private ResponseHead(string statusLine, int statusCode, IReadOnlyList<KeyValuePair<string, string>> headers,
        long? contentLength, BodyFraming framing, bool connectionClose)
    {
        StatusLine = statusLine;
        StatusCode = statusCode;
        Headers = headers;
        ContentLength = contentLength;
        Framing = framing;
        ConnectionClose = connectionClose;
    }

    /// <summary>The status line, without its CRLF.</summary>
    public string StatusLine { get; }

    /// <summary>The status code.</summary>
    public int StatusCode { get; }

    /// <summary>The header fields in the order sent, names as sent, values without surrounding whitespace.</summary>
    public IReadOnlyList<KeyValuePair<string, string>> Headers { get; }

    /// <summary>The Content-Length header's value, or null when there is none.</summary>
    public long? ContentLength { get; }

    /// <summary>How the body is delimited.</summary>
    public BodyFraming Framing { get; }

    /// <summary>Whether the response came with <c>Transfer-Encoding: chunked</c>.</summary>
    public bool IsChunked => Framing == BodyFraming.Chunked;

    /// <summary>Whether the server announced <c>Connection: close</c>: it closes the connection after this response.</summary>
    public bool ConnectionClose { get; }

    /// <summary>The values of a header, matched case-insensitively.</summary>
    /// <param name="name">The header's name.</param>
    /// <returns>Its values, in order; empty when absent.</returns>
    public IReadOnlyList<string> Values(string name) =>
        Headers.Where(h => string.Equals(h.Key, name, StringComparison.OrdinalIgnoreCase)).Select(h => h.Value).ToList();

    /// <summary>The single value of a header, or null when absent.</summary>
    /// <param name="name">The header's name.</param>
    /// <returns>The value.</returns>
    /// <exception cref="InvalidOperationException">The header was sent more than once.</exception>
    public string? Value(string name) => Values(name).SingleOrDefault();

    /// <summary>Parses a response head.</summary>
    /// <param name="lines">The status line, then one line per header field, without CRLFs or the empty line that ends the head.</param>
    /// <returns>The head.</returns>
    /// <exception cref="InvalidDataException">The head is not one a correct HTTP/1.1 server sends.</exception>
    public static ResponseHead Parse(IReadOnlyList<string> lines)
    {
        ArgumentNullException.ThrowIfNull(lines);
        if (lines.Count == 0)
        {
            throw new InvalidDataException("An empty response head.");
        }

        foreach (var line in lines)
        {
            // Lines were split at CRLF; a CR or LF left inside one is a bare line ending, which
            // RFC 9112 (section 2.2) forbids and which would otherwise hide a header inside another.
            if (line.AsSpan().IndexOfAny('\r', '\n') >= 0)
            {
                throw new InvalidDataException($"A bare CR or LF in the response line '{line.ReplaceLineEndings(" ")}'.");
            }
        }

        // status-line = HTTP-version SP status-code SP [ reason-phrase ]: both spaces are required.
        var statusLine = lines[0];
        var parts = statusLine.Split(' ', 3);
        if (parts.Length < 3 || parts[0] != "HTTP/1.1" || parts[1].Length != 3
            || !int.TryParse(parts[1], NumberStyles.None, CultureInfo.InvariantCulture, out var statusCode))
        {
            throw new InvalidDataException($"Not an HTTP/1.1 status line: '{statusLine}'.");
        }

        var headers = new List<KeyValuePair<string, string>>(lines.Count - 1);
        long? contentLength = null;
        string? transferEncoding = null;
        var connectionClose = false;
        for (var i = 1; i < lines.Count; i++)
        {
            var line = lines[i];
            var colon = line.IndexOf(':', StringComparison.Ordinal);
            if (colon <= 0)
            {
                throw new InvalidDataException($"Not a header line: '{line}'.");
            }

            var name = line[..colon];
            var value = line[(colon + 1)..].Trim();
            headers.Add(new(name, value));
            if (name.Equals("Content-Length", StringComparison.OrdinalIgnoreCase))
            {
                // Two lengths, even equal ones, mean the framing cannot be trusted (RFC 9112, section 6.3).
                if (contentLength is not null || !long.TryParse(value, NumberStyles.None, CultureInfo.InvariantCulture, out var length))
                {
                    throw new InvalidDataException($"A bad or repeated Content-Length: '{line}'.");
                }

                contentLength = length;
            }
            else if (name.Equals("Transfer-Encoding", StringComparison.OrdinalIgnoreCase))
            {
                transferEncoding = transferEncoding is null ? value : $"{transferEncoding}, {value}";
            }
            else if (name.Equals("Connection", StringComparison.OrdinalIgnoreCase))
            {
                connectionClose |= value.Split(',').Any(token => token.Trim().Equals("close", StringComparison.OrdinalIgnoreCase));
            }
        }

        // No server under test applies a transfer coding other than chunked; one that did could not be
        // read as the body it announces, so it is refused rather than half understood.
        if (transferEncoding is not null && !transferEncoding.Equals("chunked", StringComparison.OrdinalIgnoreCase))
        {
            throw new InvalidDataException($"An unsupported Transfer-Encoding: '{transferEncoding}'.");
        }

        if (transferEncoding is not null && contentLength is not null)
        {
            throw new InvalidDataException("A response with both Content-Length and Transfer-Encoding: chunked.");
        }

        var framing = statusCode is (>= 100 and < 200) or 204 or 304 ? BodyFraming.None
            : transferEncoding is not null ? BodyFraming.Chunked
            : contentLength is not null ? BodyFraming.ContentLength
            : BodyFraming.UntilClose;
        return new ResponseHead(statusLine, statusCode, headers, contentLength, framing, connectionClose);
    }
}
