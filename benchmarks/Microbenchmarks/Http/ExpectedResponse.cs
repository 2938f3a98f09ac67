using System.Text;

namespace Kestrel.Transport.Linux.Microbenchmarks.Http;

/// <summary>
/// The exact bytes one response must have, with the Date value as the only wildcard. The IMF-fixdate Kestrel
/// writes ("Sun, 06 Nov 1994 08:49:37 GMT", RFC 9110 5.6.7) is always 29 characters, so every response of a
/// kind has the same length and a pipelined batch's length is known before it is read.
/// </summary>
internal sealed class ExpectedResponse
{
    private const int DateLength = 29;
    private static readonly byte[] s_statusLine = "HTTP/1.1 200 OK\r\n"u8.ToArray();

    private readonly byte[] _template;
    private readonly int _dateOffset;

    public ExpectedResponse(string contentType, ReadOnlySpan<byte> body)
    {
        // Kestrel writes its known response headers in this order (checked against a live response in setup).
        string head = $"HTTP/1.1 200 OK\r\nContent-Length: {body.Length}\r\nContent-Type: {contentType}\r\nDate: ";
        string tail = "\r\nServer: Kestrel\r\n\r\n";
        _template = [.. Encoding.ASCII.GetBytes(head), .. new byte[DateLength], .. Encoding.ASCII.GetBytes(tail), .. body];
        _dateOffset = head.Length;
        Body = body.ToArray();
    }

    public static ExpectedResponse Plaintext { get; } = new("text/plain", HelloWorldApp.PlaintextBody);

    public static ExpectedResponse Json { get; } = new("application/json", "{\"message\":\"Hello, World!\"}"u8);

    public int Length => _template.Length;

    public byte[] Body { get; }

    /// <summary>Throws unless <paramref name="batch"/> is <paramref name="count"/> responses of this kind, back to back.</summary>
    /// <remarks>
    /// Every response's status line is compared, and the last one byte for byte (headers and body, Date aside):
    /// with exact lengths, a wrong response anywhere either fails here or leaves the read short and times out.
    /// </remarks>
    public void Verify(ReadOnlySpan<byte> batch, int count)
    {
        if (batch.Length != count * Length)
        {
            throw Mismatch(batch, $"expected {count} x {Length} bytes, got {batch.Length}");
        }

        for (int i = 0; i < count; i++)
        {
            if (!batch.Slice(i * Length).StartsWith(s_statusLine))
            {
                throw Mismatch(batch.Slice(i * Length, Length), $"response {i + 1} of {count} is not 200 OK");
            }
        }

        ReadOnlySpan<byte> last = batch[^Length..];
        int dateEnd = _dateOffset + DateLength;
        if (!last[.._dateOffset].SequenceEqual(_template.AsSpan(0, _dateOffset))
            || !last[dateEnd..].SequenceEqual(_template.AsSpan(dateEnd)))
        {
            throw Mismatch(last, "the last response differs from the expected one");
        }
    }

    private InvalidDataException Mismatch(ReadOnlySpan<byte> actual, string what)
    {
        string expected = Encoding.ASCII.GetString(_template).Replace("\0", "D", StringComparison.Ordinal);
        string got = Encoding.ASCII.GetString(actual[..Math.Min(actual.Length, 2 * Length)]);
        return new InvalidDataException($"{what}.\nExpected (D = any date):\n{expected}\nGot:\n{got}");
    }
}
