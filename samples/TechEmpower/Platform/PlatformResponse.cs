using System.Buffers.Text;
using System.IO.Pipelines;

namespace TechEmpower.Platform;

/// <summary>
/// Writes one HTTP/1.1 response into the output pipe, composed header by header for every
/// response: status line, <c>Server</c>, <c>Content-Type</c>, <c>Content-Length</c>, the cached
/// <c>Date</c> line, and the body. Nothing is flushed here; the handler flushes once per read.
/// </summary>
public static class PlatformResponse
{
    // The longest Content-Length an int can need.
    private const int MaxLengthDigits = 10;

    private static ReadOnlySpan<byte> Status200 => "HTTP/1.1 200 OK\r\n"u8;
    private static ReadOnlySpan<byte> Status400 => "HTTP/1.1 400 Bad Request\r\n"u8;
    private static ReadOnlySpan<byte> Status404 => "HTTP/1.1 404 Not Found\r\n"u8;
    private static ReadOnlySpan<byte> Status405 => "HTTP/1.1 405 Method Not Allowed\r\nAllow: GET\r\n"u8;
    private static ReadOnlySpan<byte> Status431 => "HTTP/1.1 431 Request Header Fields Too Large\r\n"u8;
    private static ReadOnlySpan<byte> ServerLine => "Server: K\r\n"u8;
    private static ReadOnlySpan<byte> TextPlain => "Content-Type: text/plain\r\n"u8;
    private static ReadOnlySpan<byte> ApplicationJson => "Content-Type: application/json\r\n"u8;
    private static ReadOnlySpan<byte> ContentLengthName => "Content-Length: "u8;
    private static ReadOnlySpan<byte> ConnectionClose => "Connection: close\r\n"u8;
    private static ReadOnlySpan<byte> Crlf => "\r\n"u8;
    private static ReadOnlySpan<byte> HelloWorld => "Hello, World!"u8;

    /// <summary>The plaintext test: <c>Hello, World!</c> as text/plain.</summary>
    /// <param name="output">The connection's output pipe.</param>
    /// <param name="date">The cached Date header.</param>
    /// <param name="close">Whether to add <c>Connection: close</c>.</param>
    public static void Plaintext(PipeWriter output, DateHeader date, bool close) =>
        Write(output, Status200, TextPlain, date, HelloWorld, close);

    /// <summary>The JSON test: <c>{"message":"Hello, World!"}</c>, serialized for this response.</summary>
    /// <param name="output">The connection's output pipe.</param>
    /// <param name="date">The cached Date header.</param>
    /// <param name="close">Whether to add <c>Connection: close</c>.</param>
    public static void Json(PipeWriter output, DateHeader date, bool close) =>
        Write(output, Status200, ApplicationJson, date, HelloWorldJson.Serialize(), close);

    /// <summary>404 for a path this handler does not serve.</summary>
    /// <param name="output">The connection's output pipe.</param>
    /// <param name="date">The cached Date header.</param>
    /// <param name="close">Whether to add <c>Connection: close</c>.</param>
    public static void NotFound(PipeWriter output, DateHeader date, bool close) =>
        Write(output, Status404, TextPlain, date, "Not Found"u8, close);

    /// <summary>405 for a method other than GET.</summary>
    /// <param name="output">The connection's output pipe.</param>
    /// <param name="date">The cached Date header.</param>
    /// <param name="close">Whether to add <c>Connection: close</c>.</param>
    public static void MethodNotAllowed(PipeWriter output, DateHeader date, bool close) =>
        Write(output, Status405, TextPlain, date, "Method Not Allowed"u8, close);

    /// <summary>400 for a malformed request; always closes.</summary>
    /// <param name="output">The connection's output pipe.</param>
    /// <param name="date">The cached Date header.</param>
    public static void BadRequest(PipeWriter output, DateHeader date) =>
        Write(output, Status400, TextPlain, date, "Bad Request"u8, close: true);

    /// <summary>431 for a request head longer than the handler buffers; always closes.</summary>
    /// <param name="output">The connection's output pipe.</param>
    /// <param name="date">The cached Date header.</param>
    public static void HeadTooLarge(PipeWriter output, DateHeader date) =>
        Write(output, Status431, TextPlain, date, "Request Header Fields Too Large"u8, close: true);

    private static void Write(
        PipeWriter output,
        ReadOnlySpan<byte> statusLine,
        ReadOnlySpan<byte> contentTypeLine,
        DateHeader date,
        ReadOnlySpan<byte> body,
        bool close)
    {
        Span<byte> digits = stackalloc byte[MaxLengthDigits];
        Utf8Formatter.TryFormat(body.Length, digits, out var digitCount);
        var dateLine = date.Line;

        var length = statusLine.Length + ServerLine.Length + contentTypeLine.Length
            + ContentLengthName.Length + digitCount + Crlf.Length + dateLine.Length
            + (close ? ConnectionClose.Length : 0) + Crlf.Length + body.Length;

        // One span for the whole response: a few hundred bytes at most, well inside a 4 KiB pool block.
        var span = output.GetSpan(length);
        var position = 0;
        Append(span, ref position, statusLine);
        Append(span, ref position, ServerLine);
        Append(span, ref position, contentTypeLine);
        Append(span, ref position, ContentLengthName);
        Append(span, ref position, digits[..digitCount]);
        Append(span, ref position, Crlf);
        Append(span, ref position, dateLine);
        if (close)
        {
            Append(span, ref position, ConnectionClose);
        }

        Append(span, ref position, Crlf);
        Append(span, ref position, body);
        output.Advance(length);
    }

    private static void Append(Span<byte> destination, ref int position, ReadOnlySpan<byte> source)
    {
        source.CopyTo(destination[position..]);
        position += source.Length;
    }
}
