using System.Text;

namespace RawHttp;

/// <summary>Minimal HTTP/1.1 requests, as text or bytes, for tests that send them by hand.</summary>
public static class RawHttpRequest
{
    /// <summary>A request without a body: the request line, <c>Host: localhost</c>, any further header lines, the empty line.</summary>
    /// <param name="method">The method.</param>
    /// <param name="path">The request target.</param>
    /// <param name="extraHeaders">Further header lines, each ending in CRLF, or null.</param>
    /// <returns>The request's text.</returns>
    public static string Text(string method, string path, string? extraHeaders = null) =>
        $"{method} {path} HTTP/1.1\r\nHost: localhost\r\n{extraHeaders}\r\n";

    /// <summary>The same request as <see cref="Text"/>, in ASCII bytes.</summary>
    /// <param name="method">The method.</param>
    /// <param name="path">The request target.</param>
    /// <param name="extraHeaders">Further header lines, each ending in CRLF, or null.</param>
    /// <returns>The request's bytes.</returns>
    public static byte[] Bytes(string method, string path, string? extraHeaders = null) =>
        Encoding.ASCII.GetBytes(Text(method, path, extraHeaders));

    /// <summary>A GET of <paramref name="path"/> with nothing but a Host header.</summary>
    /// <param name="path">The request target.</param>
    /// <returns>The request's text.</returns>
    public static string Get(string path) => Text("GET", path);
}
