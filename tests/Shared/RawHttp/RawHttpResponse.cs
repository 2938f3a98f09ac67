using System.Text;

namespace RawHttp;

/// <summary>One complete HTTP/1.1 response as it came off the wire.</summary>
/// <param name="Head">The status line and header fields.</param>
/// <param name="Body">The body, de-chunked if it was chunked.</param>
public sealed record RawHttpResponse(ResponseHead Head, byte[] Body)
{
    /// <summary>The status line, without its CRLF.</summary>
    public string StatusLine => Head.StatusLine;

    /// <summary>The status code.</summary>
    public int StatusCode => Head.StatusCode;

    /// <summary>The header fields in the order sent, names as sent.</summary>
    public IReadOnlyList<KeyValuePair<string, string>> Headers => Head.Headers;

    /// <summary>Whether it came with <c>Transfer-Encoding: chunked</c>.</summary>
    public bool IsChunked => Head.IsChunked;

    /// <summary>The body as UTF-8 text.</summary>
    public string BodyText => Encoding.UTF8.GetString(Body);

    /// <summary>The values of a header, matched case-insensitively.</summary>
    /// <param name="name">The header's name.</param>
    /// <returns>Its values, in order; empty when absent.</returns>
    public IReadOnlyList<string> Values(string name) => Head.Values(name);

    /// <summary>The single value of a header, or null when absent.</summary>
    /// <param name="name">The header's name.</param>
    /// <returns>The value.</returns>
    /// <exception cref="InvalidOperationException">The header was sent more than once.</exception>
    public string? Value(string name) => Head.Value(name);
}
