using System.Globalization;
using System.Net.Sockets;
using System.Text;

namespace Kestrel.Transport.Linux.Reliability.Tests.Infrastructure;

/// <summary>
/// A lean HTTP/1.1 client side of one socket for the load tests, where thousands of connections must not
/// cost much memory each: a small buffer, requests sent as bytes, responses with Content-Length only.
/// </summary>
internal sealed class HttpExchange : IDisposable
{
    private readonly byte[] _buffer = new byte[1024];
    private int _start;
    private int _end;

    public HttpExchange(Socket socket) => Socket = socket;

    public Socket Socket { get; }

    public static byte[] Request(string method, string path, string? extraHeaders = null)
        => Encoding.ASCII.GetBytes($"{method} {path} HTTP/1.1\r\nHost: localhost\r\n{extraHeaders}\r\n");

    public Task SendAsync(ReadOnlyMemory<byte> bytes) => Socket.SendAllAsync(bytes, TestTimeouts.Large);

    /// <summary>Reads one response with a Content-Length body; returns the status code and the body as text.</summary>
    public async Task<(int Status, string Body)> ReadResponseAsync(TimeSpan timeout)
    {
        using var cts = new CancellationTokenSource(timeout);
        int headEnd;
        while ((headEnd = _buffer.AsSpan(_start, _end - _start).IndexOf("\r\n\r\n"u8)) < 0)
        {
            await FillAsync(cts.Token);
        }

        var head = Encoding.ASCII.GetString(_buffer, _start, headEnd);
        _start += headEnd + 4;
        var status = int.Parse(head.AsSpan(9, 3), CultureInfo.InvariantCulture);
        var length = 0;
        foreach (var line in head.Split("\r\n"))
        {
            if (line.StartsWith("Content-Length:", StringComparison.OrdinalIgnoreCase))
            {
                length = int.Parse(line.AsSpan("Content-Length:".Length).Trim(), CultureInfo.InvariantCulture);
            }
        }

        var body = new StringBuilder();
        while (length > 0)
        {
            if (_start == _end)
            {
                await FillAsync(cts.Token);
            }

            var take = Math.Min(length, _end - _start);
            body.Append(Encoding.ASCII.GetString(_buffer, _start, take));
            _start += take;
            length -= take;
        }

        return (status, body.ToString());
    }

    public void Dispose() => Socket.Dispose();

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
            throw new InvalidDataException("A response head longer than the load client's 1 KiB buffer.");
        }

        int n;
        try
        {
            n = await Socket.ReceiveAsync(_buffer.AsMemory(_end), SocketFlags.None, cancellationToken);
        }
        catch (OperationCanceledException) when (cancellationToken.IsCancellationRequested)
        {
            throw new TimeoutException($"A response did not arrive in time; {_end - _start} bytes were buffered.");
        }

        if (n == 0)
        {
            throw new EndOfStreamException("The server closed the connection before the response was complete.");
        }

        _end += n;
    }
}
