using System.Globalization;
using System.Net;
using System.Net.Sockets;
using System.Security.Cryptography;
using System.Text;

namespace Soak;

/// <summary>The status line and the headers of a response that matter here.</summary>
public readonly record struct ResponseHead(int Status, long ContentLength, bool Chunked, bool Close);

/// <summary>
/// A minimal HTTP/1.1 client connection over a raw socket, so the soak controls every byte: it can
/// send malformed requests, stop halfway and reset the connection (RST, via SO_LINGER 0).
/// </summary>
public sealed class RawHttpConnection : IDisposable
{
    private const int MaxHead = 64 * 1024;
    private readonly Socket _socket;
    private readonly byte[] _buffer = new byte[MaxHead];
    private int _start;
    private int _end;

    private RawHttpConnection(Socket socket) => _socket = socket;

    public static async Task<RawHttpConnection> ConnectAsync(EndPoint endPoint, CancellationToken token)
    {
        var socket = new Socket(endPoint.AddressFamily, SocketType.Stream, ProtocolType.Tcp) { NoDelay = true };
        try
        {
            await socket.ConnectAsync(endPoint, token);
            return new RawHttpConnection(socket);
        }
        catch
        {
            socket.Dispose();
            throw;
        }
    }

    public async Task SendAsync(ReadOnlyMemory<byte> data, CancellationToken token)
    {
        while (!data.IsEmpty)
        {
            var sent = await _socket.SendAsync(data, SocketFlags.None, token);
            data = data[sent..];
        }
    }

    public Task SendAsync(string text, CancellationToken token) => SendAsync(Encoding.ASCII.GetBytes(text), token);

    /// <summary>Sends <paramref name="length"/> bytes of <see cref="Payload"/>(seed), hashing them.</summary>
    public async Task<byte[]> SendPayloadAsync(ulong seed, long length, CancellationToken token)
    {
        using var hash = IncrementalHash.CreateHash(HashAlgorithmName.SHA256);
        var payload = new Payload(seed);
        var chunk = new byte[64 * 1024];
        for (var remaining = length; remaining > 0;)
        {
            var n = (int)Math.Min(chunk.Length, remaining);
            payload.Fill(chunk.AsSpan(0, n));
            hash.AppendData(chunk, 0, n);
            await SendAsync(chunk.AsMemory(0, n), token);
            remaining -= n;
        }

        return hash.GetHashAndReset();
    }

    /// <summary>Reads the next response's head; null when the server closed before sending a byte.</summary>
    public async Task<ResponseHead?> ReadHeadAsync(CancellationToken token)
    {
        while (true)
        {
            var end = _buffer.AsSpan(_start, _end - _start).IndexOf("\r\n\r\n"u8);
            if (end >= 0)
            {
                var head = Parse(Encoding.ASCII.GetString(_buffer, _start, end));
                _start += end + 4;
                return head;
            }

            if (_end - _start >= MaxHead)
            {
                throw new InvalidDataException("response head too large");
            }

            var hadBytes = _end > _start;
            if (await FillAsync(token) == 0)
            {
                return hadBytes ? throw new IOException("connection closed inside a response head") : null;
            }
        }
    }

    /// <summary>Reads the body <paramref name="head"/> announced, handing its bytes to <paramref name="sink"/> when given.</summary>
    public async Task<long> ReadBodyAsync(ResponseHead head, Action<byte[], int, int>? sink, CancellationToken token)
    {
        if (head.Chunked)
        {
            long total = 0;
            while (true)
            {
                var line = await ReadLineAsync(token);
                var semicolon = line.IndexOf(';', StringComparison.Ordinal);
                var size = long.Parse(semicolon >= 0 ? line[..semicolon] : line, NumberStyles.HexNumber, CultureInfo.InvariantCulture);
                if (size == 0)
                {
                    while ((await ReadLineAsync(token)).Length > 0)
                    {
                        // trailers
                    }

                    return total;
                }

                await ReadExactAsync(size, sink, token);
                total += size;
                if ((await ReadLineAsync(token)).Length != 0)
                {
                    throw new InvalidDataException("bad chunk terminator");
                }
            }
        }

        if (head.ContentLength >= 0)
        {
            await ReadExactAsync(head.ContentLength, sink, token);
            return head.ContentLength;
        }

        long read = 0;
        while (true)
        {
            if (_end > _start)
            {
                sink?.Invoke(_buffer, _start, _end - _start);
                read += _end - _start;
                _start = _end;
            }

            if (await FillAsync(token) == 0)
            {
                return read;
            }
        }
    }

    /// <summary>Reads and drops up to <paramref name="count"/> bytes (fewer at end of stream).</summary>
    public async Task<long> SkipAsync(long count, CancellationToken token)
    {
        long skipped = 0;
        while (skipped < count)
        {
            if (_end == _start && await FillAsync(token) == 0)
            {
                break;
            }

            var n = (int)Math.Min(_end - _start, count - skipped);
            _start += n;
            skipped += n;
        }

        return skipped;
    }

    /// <summary>True when the server closed the connection (FIN or RST) with no further bytes.</summary>
    public async Task<bool> ReadsEndAsync(CancellationToken token)
    {
        try
        {
            return _end == _start && await FillAsync(token) == 0;
        }
        catch (SocketException)
        {
            return true;
        }
    }

    /// <summary>Resets the connection: SO_LINGER 0, so close sends RST instead of FIN.</summary>
    public void Abort()
    {
        try
        {
            _socket.LingerState = new LingerOption(true, 0);
        }
        catch (SocketException)
        {
        }

        _socket.Dispose();
    }

    public void Dispose() => _socket.Dispose();

    private async Task ReadExactAsync(long count, Action<byte[], int, int>? sink, CancellationToken token)
    {
        while (count > 0)
        {
            if (_end == _start && await FillAsync(token) == 0)
            {
                throw new IOException("connection closed inside a response body");
            }

            var n = (int)Math.Min(_end - _start, count);
            sink?.Invoke(_buffer, _start, n);
            _start += n;
            count -= n;
        }
    }

    private async Task<string> ReadLineAsync(CancellationToken token)
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

            if (await FillAsync(token) == 0)
            {
                throw new IOException("connection closed inside a chunk header");
            }
        }
    }

    private async Task<int> FillAsync(CancellationToken token)
    {
        if (_start == _end)
        {
            _start = _end = 0;
        }
        else if (_end == _buffer.Length)
        {
            Buffer.BlockCopy(_buffer, _start, _buffer, 0, _end - _start);
            _end -= _start;
            _start = 0;
        }

        var n = await _socket.ReceiveAsync(_buffer.AsMemory(_end), SocketFlags.None, token);
        _end += n;
        return n;
    }

    private static ResponseHead Parse(string head)
    {
        var lines = head.Split("\r\n");
        var status = lines[0].Split(' ');
        if (status.Length < 2 || !status[0].StartsWith("HTTP/1.", StringComparison.Ordinal)
            || !int.TryParse(status[1], NumberStyles.None, CultureInfo.InvariantCulture, out var code))
        {
            throw new InvalidDataException($"bad status line '{lines[0]}'");
        }

        long length = -1;
        bool chunked = false, close = status[0] == "HTTP/1.0";
        foreach (var line in lines.AsSpan(1))
        {
            var colon = line.IndexOf(':', StringComparison.Ordinal);
            if (colon <= 0)
            {
                continue;
            }

            var name = line[..colon].Trim();
            var value = line[(colon + 1)..].Trim();
            if (name.Equals("Content-Length", StringComparison.OrdinalIgnoreCase))
            {
                length = long.Parse(value, NumberStyles.None, CultureInfo.InvariantCulture);
            }
            else if (name.Equals("Transfer-Encoding", StringComparison.OrdinalIgnoreCase))
            {
                chunked = value.Contains("chunked", StringComparison.OrdinalIgnoreCase);
            }
            else if (name.Equals("Connection", StringComparison.OrdinalIgnoreCase))
            {
                close = value.Contains("close", StringComparison.OrdinalIgnoreCase);
            }
        }

        return new ResponseHead(code, length, chunked, close);
    }
}
