using System.Net;
using System.Net.Sockets;
using System.Text;

namespace TechEmpower.Tests.Infrastructure;

/// <summary>One HTTP/1.1 response as it came off the wire.</summary>
/// <param name="StatusCode">The status code.</param>
/// <param name="Headers">The header fields in order, names as sent.</param>
/// <param name="Body">The body, de-chunked if it was chunked.</param>
/// <param name="IsChunked">Whether it came with <c>Transfer-Encoding: chunked</c>.</param>
public sealed record RawHttpResponse(int StatusCode, IReadOnlyList<KeyValuePair<string, string>> Headers, byte[] Body, bool IsChunked)
{
    /// <summary>The body as UTF-8 text.</summary>
    public string BodyText => Encoding.UTF8.GetString(Body);

    /// <summary>The values of a header, matched case-insensitively.</summary>
    /// <param name="name">The header's name.</param>
    /// <returns>Its values, in order; empty when absent.</returns>
    public IReadOnlyList<string> Values(string name) =>
        Headers.Where(h => string.Equals(h.Key, name, StringComparison.OrdinalIgnoreCase)).Select(h => h.Value).ToList();

    /// <summary>The single value of a header, or null when absent.</summary>
    /// <param name="name">The header's name.</param>
    /// <returns>The value.</returns>
    public string? Value(string name) => Values(name).SingleOrDefault();
}

/// <summary>
/// A raw TCP or Unix-socket connection for what HttpClient cannot do: several requests in one write
/// (pipelining), garbage, and reading responses exactly as sent. Every read is bounded by a token.
/// </summary>
public sealed class RawHttpConnection : IAsyncDisposable
{
    private readonly Socket _socket;
    private byte[] _buffer = new byte[16 * 1024];
    private int _start;
    private int _end;

    private RawHttpConnection(Socket socket) => _socket = socket;

    /// <summary>Connects to a URL the sample printed: <c>http://127.0.0.1:PORT</c> or <c>http://unix:/PATH</c>.</summary>
    /// <param name="url">The URL.</param>
    /// <param name="cancellationToken">Bounds the connect.</param>
    /// <returns>The connection.</returns>
    public static async Task<RawHttpConnection> ConnectAsync(string url, CancellationToken cancellationToken)
    {
        EndPoint endpoint;
        Socket socket;
        if (url.StartsWith("http://unix:", StringComparison.Ordinal))
        {
            endpoint = new UnixDomainSocketEndPoint(url["http://unix:".Length..]);
            socket = new Socket(AddressFamily.Unix, SocketType.Stream, ProtocolType.Unspecified);
        }
        else
        {
            var uri = new Uri(url);
            endpoint = new IPEndPoint(IPAddress.Parse(uri.Host.Trim('[', ']')), uri.Port);
            socket = new Socket(endpoint.AddressFamily, SocketType.Stream, ProtocolType.Tcp) { NoDelay = true };
        }

        try
        {
            await socket.ConnectAsync(endpoint, cancellationToken);
            return new RawHttpConnection(socket);
        }
        catch
        {
            socket.Dispose();
            throw;
        }
    }

    /// <summary>Sends bytes in one write.</summary>
    /// <param name="data">The bytes.</param>
    /// <param name="cancellationToken">Bounds the send.</param>
    /// <returns>A task that completes when the kernel took every byte.</returns>
    public async Task SendAsync(ReadOnlyMemory<byte> data, CancellationToken cancellationToken)
    {
        while (!data.IsEmpty)
        {
            var sent = await _socket.SendAsync(data, SocketFlags.None, cancellationToken);
            data = data[sent..];
        }
    }

    /// <summary>Sends ASCII text in one write.</summary>
    /// <param name="text">The text, CRLFs included.</param>
    /// <param name="cancellationToken">Bounds the send.</param>
    /// <returns>A task that completes when the kernel took every byte.</returns>
    public Task SendAsync(string text, CancellationToken cancellationToken) =>
        SendAsync(Encoding.ASCII.GetBytes(text), cancellationToken);

    /// <summary>Reads one complete response: status line, headers, and a body framed by Content-Length or chunks.</summary>
    /// <param name="cancellationToken">Bounds the read.</param>
    /// <returns>The response.</returns>
    /// <exception cref="EndOfStreamException">The server closed the connection before a whole response.</exception>
    public async Task<RawHttpResponse> ReadResponseAsync(CancellationToken cancellationToken)
    {
        var statusLine = await ReadLineAsync(cancellationToken)
            ?? throw new EndOfStreamException("The server closed the connection instead of responding.");
        var parts = statusLine.Split(' ', 3);
        if (parts.Length < 2 || parts[0] != "HTTP/1.1" || !int.TryParse(parts[1], out var status))
        {
            throw new InvalidDataException($"Not an HTTP/1.1 status line: '{statusLine}'.");
        }

        var headers = new List<KeyValuePair<string, string>>();
        while (true)
        {
            var line = await ReadLineAsync(cancellationToken)
                ?? throw new EndOfStreamException("The server closed the connection inside the response head.");
            if (line.Length == 0)
            {
                break;
            }

            var colon = line.IndexOf(':', StringComparison.Ordinal);
            if (colon <= 0)
            {
                throw new InvalidDataException($"Not a header line: '{line}'.");
            }

            headers.Add(new(line[..colon], line[(colon + 1)..].Trim()));
        }

        var chunked = headers.Any(h => string.Equals(h.Key, "Transfer-Encoding", StringComparison.OrdinalIgnoreCase)
            && h.Value.Contains("chunked", StringComparison.OrdinalIgnoreCase));
        var lengthText = headers.FirstOrDefault(h => string.Equals(h.Key, "Content-Length", StringComparison.OrdinalIgnoreCase)).Value;

        byte[] body;
        if (chunked)
        {
            using var collected = new MemoryStream();
            while (true)
            {
                var sizeLine = await ReadLineAsync(cancellationToken)
                    ?? throw new EndOfStreamException("The server closed the connection inside a chunked body.");
                var size = Convert.ToInt32(sizeLine.Split(';')[0].Trim(), 16);
                if (size == 0)
                {
                    // Trailers, if any, end with an empty line.
                    while ((await ReadLineAsync(cancellationToken))?.Length > 0)
                    {
                    }

                    break;
                }

                collected.Write(await ReadExactlyAsync(size, cancellationToken));
                if (await ReadLineAsync(cancellationToken) != "")
                {
                    throw new InvalidDataException("A chunk did not end with CRLF.");
                }
            }

            body = collected.ToArray();
        }
        else if (lengthText is not null)
        {
            body = await ReadExactlyAsync(int.Parse(lengthText, System.Globalization.CultureInfo.InvariantCulture), cancellationToken);
        }
        else
        {
            throw new InvalidDataException("The response has neither Content-Length nor chunked Transfer-Encoding.");
        }

        return new RawHttpResponse(status, headers, body, chunked);
    }

    /// <summary>Waits for the server to close the connection.</summary>
    /// <param name="cancellationToken">Bounds the wait.</param>
    /// <returns>True when it closed (or reset) with no further bytes; false when bytes came instead.</returns>
    public async Task<bool> ReadEndAsync(CancellationToken cancellationToken)
    {
        if (_end > _start)
        {
            return false;
        }

        try
        {
            return await FillAsync(cancellationToken) == 0;
        }
        catch (SocketException e) when (e.SocketErrorCode == SocketError.ConnectionReset)
        {
            return true;
        }
    }

    /// <inheritdoc />
    public ValueTask DisposeAsync()
    {
        _socket.Dispose();
        return ValueTask.CompletedTask;
    }

    private async Task<string?> ReadLineAsync(CancellationToken cancellationToken)
    {
        while (true)
        {
            var lf = Array.IndexOf(_buffer, (byte)'\n', _start, _end - _start);
            if (lf >= 0)
            {
                if (lf == _start || _buffer[lf - 1] != '\r')
                {
                    throw new InvalidDataException("A line ended with a bare LF.");
                }

                var line = Encoding.ASCII.GetString(_buffer, _start, lf - 1 - _start);
                _start = lf + 1;
                return line;
            }

            if (await FillAsync(cancellationToken) == 0)
            {
                return null;
            }
        }
    }

    private async Task<byte[]> ReadExactlyAsync(int count, CancellationToken cancellationToken)
    {
        while (_end - _start < count)
        {
            if (await FillAsync(cancellationToken) == 0)
            {
                throw new EndOfStreamException($"The server closed the connection {count - (_end - _start)} bytes short of a body.");
            }
        }

        var data = _buffer.AsSpan(_start, count).ToArray();
        _start += count;
        return data;
    }

    // Appends what the socket has to the buffer; returns 0 at end of stream.
    private async Task<int> FillAsync(CancellationToken cancellationToken)
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

        var read = await _socket.ReceiveAsync(_buffer.AsMemory(_end), SocketFlags.None, cancellationToken);
        _end += read;
        return read;
    }
}
