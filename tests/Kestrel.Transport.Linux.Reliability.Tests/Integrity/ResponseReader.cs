using System.Globalization;
using System.Net.Sockets;
using System.Text;

namespace Kestrel.Transport.Linux.Reliability.Tests.Integrity;

/// <summary>One HTTP/1.1 response as read off the wire, body de-chunked.</summary>
internal sealed record WireResponse(int StatusCode, IReadOnlyDictionary<string, string> Headers, byte[] Body, bool WasChunked);

/// <summary>
/// Reads consecutive HTTP/1.1 responses (Content-Length or chunked) from a socket the test also writes to
/// directly, so that requests can carry binary bodies cut into arbitrary sends.
/// </summary>
internal sealed class ResponseReader(Socket socket)
{
    private byte[] _buffer = new byte[64 * 1024];
    private int _start;
    private int _end;

    public async Task<WireResponse> ReadAsync(CancellationToken cancellationToken)
    {
        var head = Encoding.ASCII.GetString(await ReadUntilAsync("\r\n\r\n"u8.ToArray(), cancellationToken));
        var lines = head.Split("\r\n");
        var status = lines[0].Split(' ', 3);
        Assert.True(status.Length >= 2 && status[0] == "HTTP/1.1", $"Not an HTTP/1.1 status line: '{lines[0]}'");
        var headers = new Dictionary<string, string>(StringComparer.OrdinalIgnoreCase);
        foreach (var line in lines.Skip(1))
        {
            var colon = line.IndexOf(':', StringComparison.Ordinal);
            headers[line[..colon]] = line[(colon + 1)..].Trim();
        }

        var code = int.Parse(status[1], CultureInfo.InvariantCulture);
        if (headers.TryGetValue("Content-Length", out var length))
        {
            return new WireResponse(code, headers, await ReadExactlyAsync(int.Parse(length, CultureInfo.InvariantCulture), cancellationToken), WasChunked: false);
        }

        Assert.True(headers.TryGetValue("Transfer-Encoding", out var encoding) && encoding == "chunked", $"A response {code} with neither Content-Length nor chunked framing.");
        using var body = new MemoryStream();
        while (true)
        {
            var sizeLine = Encoding.ASCII.GetString(await ReadUntilAsync("\r\n"u8.ToArray(), cancellationToken));
            var size = int.Parse(sizeLine.Split(';')[0], NumberStyles.HexNumber, CultureInfo.InvariantCulture);
            if (size == 0)
            {
                Assert.Empty(await ReadUntilAsync("\r\n"u8.ToArray(), cancellationToken));
                return new WireResponse(code, headers, body.ToArray(), WasChunked: true);
            }

            body.Write(await ReadExactlyAsync(size, cancellationToken));
            Assert.Empty(await ReadUntilAsync("\r\n"u8.ToArray(), cancellationToken));
        }
    }

    private async Task<byte[]> ReadUntilAsync(byte[] delimiter, CancellationToken cancellationToken)
    {
        while (true)
        {
            var at = _buffer.AsSpan(_start, _end - _start).IndexOf(delimiter);
            if (at >= 0)
            {
                var result = _buffer.AsSpan(_start, at).ToArray();
                _start += at + delimiter.Length;
                return result;
            }

            await FillAsync(cancellationToken);
        }
    }

    private async Task<byte[]> ReadExactlyAsync(int count, CancellationToken cancellationToken)
    {
        var result = new byte[count];
        var copied = 0;
        while (copied < count)
        {
            if (_start == _end)
            {
                await FillAsync(cancellationToken);
            }

            var take = Math.Min(count - copied, _end - _start);
            _buffer.AsSpan(_start, take).CopyTo(result.AsSpan(copied));
            _start += take;
            copied += take;
        }

        return result;
    }

    private async Task FillAsync(CancellationToken cancellationToken)
    {
        if (_start > 0)
        {
            Buffer.BlockCopy(_buffer, _start, _buffer, 0, _end - _start);
            _end -= _start;
            _start = 0;
        }

        if (_end == _buffer.Length)
        {
            Array.Resize(ref _buffer, _buffer.Length * 2);
        }

        var n = await socket.ReceiveAsync(_buffer.AsMemory(_end), SocketFlags.None, cancellationToken);
        if (n == 0)
        {
            throw new EndOfStreamException($"The server closed the connection with {_end - _start} unparsed bytes buffered.");
        }

        _end += n;
    }
}
