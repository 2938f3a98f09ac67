using System.Globalization;
using System.Net;
using System.Net.Sockets;
using System.Text;

namespace Kestrel.Transport.Linux.Tests.Infrastructure;

internal sealed record RawHttpResponse(string StatusLine, int StatusCode, IReadOnlyDictionary<string, string> Headers, byte[] Body)
{
    public string BodyText => Encoding.UTF8.GetString(Body);
}

/// <summary>
/// HTTP/1.1 over a bare socket, for what HttpClient hides: which connection carried a request, and
/// pipelining. Reads responses with Content-Length or chunked bodies; every read is bounded in time.
/// </summary>
internal sealed class RawHttpConnection : IDisposable
{
    private readonly Socket _socket;
    private byte[] _buffer = new byte[16 * 1024];
    private int _start;
    private int _end;

    private RawHttpConnection(Socket socket) => _socket = socket;

    public static async Task<RawHttpConnection> ConnectAsync(EndPoint endPoint)
        => new(await TestSockets.ConnectAsync(endPoint));

    public static string Get(string path) => $"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n";

    public Task SendAsync(string requests) => _socket.SendAllAsync(Encoding.ASCII.GetBytes(requests));

    public async Task<RawHttpResponse> ReadResponseAsync(TimeSpan? timeout = null)
    {
        using var cts = new CancellationTokenSource(timeout ?? TestTimeouts.Default);
        var head = await ReadHeadAsync(cts.Token);
        var lines = head.Split("\r\n");
        var statusLine = lines[0];
        var statusParts = statusLine.Split(' ', 3);
        Assert.True(statusParts.Length >= 2 && statusParts[0] == "HTTP/1.1", $"Not an HTTP/1.1 status line: '{statusLine}'");
        var headers = new Dictionary<string, string>(StringComparer.OrdinalIgnoreCase);
        foreach (var line in lines.Skip(1))
        {
            var colon = line.IndexOf(':', StringComparison.Ordinal);
            headers[line[..colon].Trim()] = line[(colon + 1)..].Trim();
        }

        byte[] body;
        if (headers.TryGetValue("Content-Length", out var contentLength))
        {
            body = await ReadBytesAsync(int.Parse(contentLength, CultureInfo.InvariantCulture), cts.Token);
        }
        else if (headers.TryGetValue("Transfer-Encoding", out var encoding) && encoding.Contains("chunked", StringComparison.OrdinalIgnoreCase))
        {
            body = await ReadChunkedAsync(cts.Token);
        }
        else
        {
            body = [];
        }

        return new RawHttpResponse(statusLine, int.Parse(statusParts[1], CultureInfo.InvariantCulture), headers, body);
    }

    public void Dispose() => _socket.Dispose();

    private async Task<string> ReadHeadAsync(CancellationToken cancellationToken)
    {
        while (true)
        {
            var end = _buffer.AsSpan(_start, _end - _start).IndexOf("\r\n\r\n"u8);
            if (end >= 0)
            {
                var head = Encoding.ASCII.GetString(_buffer, _start, end);
                _start += end + 4;
                return head;
            }

            await FillAsync(cancellationToken);
        }
    }

    private async Task<string> ReadLineAsync(CancellationToken cancellationToken)
    {
        while (true)
        {
            var end = _buffer.AsSpan(_start, _end - _start).IndexOf("\r\n"u8);
            if (end >= 0)
            {
                var line = Encoding.ASCII.GetString(_buffer, _start, end);
                _start += end + 2;
                return line;
            }

            await FillAsync(cancellationToken);
        }
    }

    private async Task<byte[]> ReadBytesAsync(int count, CancellationToken cancellationToken)
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

    private async Task<byte[]> ReadChunkedAsync(CancellationToken cancellationToken)
    {
        using var body = new MemoryStream();
        while (true)
        {
            var sizeLine = await ReadLineAsync(cancellationToken);
            var size = int.Parse(sizeLine.Split(';')[0], NumberStyles.HexNumber, CultureInfo.InvariantCulture);
            if (size == 0)
            {
                // Trailers, if any, end with an empty line.
                while ((await ReadLineAsync(cancellationToken)).Length > 0)
                {
                }

                return body.ToArray();
            }

            body.Write(await ReadBytesAsync(size, cancellationToken));
            Assert.Equal(string.Empty, await ReadLineAsync(cancellationToken));
        }
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

        int n;
        try
        {
            n = await _socket.ReceiveAsync(_buffer.AsMemory(_end), SocketFlags.None, cancellationToken);
        }
        catch (OperationCanceledException) when (cancellationToken.IsCancellationRequested)
        {
            throw new TimeoutException($"The response did not arrive in time; {_end - _start} unread bytes were buffered.");
        }

        if (n == 0)
        {
            throw new EndOfStreamException("The server closed the connection in the middle of a response.");
        }

        _end += n;
    }
}
