using System.Globalization;
using System.Net;
using System.Net.Sockets;
using System.Text;

namespace RawHttp;

/// <summary>Receives body bytes as they are read; the span is valid only during the call.</summary>
/// <param name="bytes">The next piece of the body.</param>
public delegate void BodySink(ReadOnlySpan<byte> bytes);

/// <summary>
/// The client side of one HTTP/1.1 connection over a bare socket, for what HttpClient hides: several
/// requests in one write (pipelining), which connection carried a request, garbage, responses read
/// exactly as sent, and connections reset (RST) or abandoned halfway. It sends whatever it is given
/// and reads responses strictly (see <see cref="ResponseHead.Parse"/>); every read is bounded by a
/// token or a timeout.
/// </summary>
public sealed class RawHttpConnection : IDisposable, IAsyncDisposable
{
    /// <summary>The read buffer's initial size, which fits any head the servers under test send.</summary>
    public const int DefaultBufferSize = 16 * 1024;

    private readonly int _maxBufferSize;
    private byte[] _buffer;
    private int _start;
    private int _end;

    /// <summary>Wraps a connected socket; disposing the connection disposes it.</summary>
    /// <param name="socket">The socket, which the caller may also write to directly.</param>
    /// <param name="bufferSize">The read buffer's initial size.</param>
    /// <param name="maxBufferSize">
    /// How large the buffer may grow, and so how long a response head may be: a load test holding
    /// thousands of connections keeps this small. Bodies stream through the buffer whatever their size.
    /// </param>
    public RawHttpConnection(Socket socket, int bufferSize = DefaultBufferSize, int maxBufferSize = int.MaxValue)
    {
        ArgumentNullException.ThrowIfNull(socket);
        ArgumentOutOfRangeException.ThrowIfNegativeOrZero(bufferSize);
        ArgumentOutOfRangeException.ThrowIfLessThan(maxBufferSize, bufferSize);
        Socket = socket;
        _buffer = new byte[bufferSize];
        _maxBufferSize = maxBufferSize;
    }

    /// <summary>The socket, for what this class does not do (half-closes, socket options, raw reads).</summary>
    public Socket Socket { get; }

    /// <summary>How many received bytes are buffered and not yet read.</summary>
    public int Buffered => _end - _start;

    /// <summary>Connects to an IP or Unix-domain socket endpoint.</summary>
    /// <param name="endPoint">The endpoint.</param>
    /// <param name="cancellationToken">Bounds the connect.</param>
    /// <returns>The connection.</returns>
    public static async Task<RawHttpConnection> ConnectAsync(EndPoint endPoint, CancellationToken cancellationToken) =>
        new(await ClientSocket.ConnectAsync(endPoint, cancellationToken));

    /// <summary>Connects to a URL as Kestrel prints it (see <see cref="ClientSocket.EndPointOf"/>).</summary>
    /// <param name="url">The URL.</param>
    /// <param name="cancellationToken">Bounds the connect.</param>
    /// <returns>The connection.</returns>
    public static Task<RawHttpConnection> ConnectAsync(string url, CancellationToken cancellationToken) =>
        ConnectAsync(ClientSocket.EndPointOf(url), cancellationToken);

    /// <summary>Sends bytes, as one write where the kernel takes them at once.</summary>
    /// <param name="data">The bytes.</param>
    /// <param name="cancellationToken">Bounds the send.</param>
    /// <returns>A task that completes when the kernel took every byte.</returns>
    public async Task SendAsync(ReadOnlyMemory<byte> data, CancellationToken cancellationToken)
    {
        while (!data.IsEmpty)
        {
            var sent = await Socket.SendAsync(data, SocketFlags.None, cancellationToken);
            data = data[sent..];
        }
    }

    /// <summary>Sends ASCII text, CRLFs included.</summary>
    /// <param name="text">The text.</param>
    /// <param name="cancellationToken">Bounds the send.</param>
    /// <returns>A task that completes when the kernel took every byte.</returns>
    public Task SendAsync(string text, CancellationToken cancellationToken) =>
        SendAsync(Encoding.ASCII.GetBytes(text), cancellationToken);

    /// <summary>Sends bytes within a time limit.</summary>
    /// <param name="data">The bytes.</param>
    /// <param name="timeout">The limit.</param>
    /// <returns>A task that completes when the kernel took every byte.</returns>
    /// <exception cref="TimeoutException">The server did not take them in time.</exception>
    public Task SendAsync(ReadOnlyMemory<byte> data, TimeSpan timeout) =>
        WithTimeoutAsync(async token => { await SendAsync(data, token); return true; }, timeout, "The send");

    /// <summary>Sends ASCII text within a time limit.</summary>
    /// <param name="text">The text, CRLFs included.</param>
    /// <param name="timeout">The limit.</param>
    /// <returns>A task that completes when the kernel took every byte.</returns>
    /// <exception cref="TimeoutException">The server did not take it in time.</exception>
    public Task SendAsync(string text, TimeSpan timeout) => SendAsync(Encoding.ASCII.GetBytes(text), timeout);

    /// <summary>Reads the next response's status line and header fields.</summary>
    /// <param name="cancellationToken">Bounds the read.</param>
    /// <returns>The head; null when the server closed the connection before sending a byte of it.</returns>
    /// <exception cref="EndOfStreamException">The server closed the connection inside the head.</exception>
    /// <exception cref="InvalidDataException">The head is malformed, or longer than the buffer may grow.</exception>
    public async Task<ResponseHead?> ReadHeadAsync(CancellationToken cancellationToken)
    {
        var lines = new List<string>();
        long headLength = 0;
        while (true)
        {
            var line = await ReadLineAsync(cancellationToken);
            if (line is null)
            {
                return lines.Count == 0 && Buffered == 0
                    ? null
                    : throw new EndOfStreamException("The server closed the connection inside a response head.");
            }

            headLength += line.Length + 2;
            if (headLength > _maxBufferSize)
            {
                throw new InvalidDataException($"A response head longer than the {_maxBufferSize}-byte buffer.");
            }

            if (line.Length == 0)
            {
                return ResponseHead.Parse(lines);
            }

            lines.Add(line);
        }
    }

    /// <summary>Reads the body <paramref name="head"/> announced, handing its bytes to <paramref name="sink"/> as they come.</summary>
    /// <param name="head">The head just read.</param>
    /// <param name="sink">Takes the body's bytes; null drops them.</param>
    /// <param name="cancellationToken">Bounds the read.</param>
    /// <returns>The body's length.</returns>
    /// <exception cref="EndOfStreamException">The server closed the connection inside the body.</exception>
    /// <exception cref="InvalidDataException">The chunked framing is malformed.</exception>
    public async Task<long> ReadBodyAsync(ResponseHead head, BodySink? sink, CancellationToken cancellationToken)
    {
        ArgumentNullException.ThrowIfNull(head);
        switch (head.Framing)
        {
            case BodyFraming.None:
                return 0;
            case BodyFraming.ContentLength:
                await ReadExactlyAsync(head.ContentLength!.Value, sink, cancellationToken);
                return head.ContentLength.Value;
            case BodyFraming.Chunked:
                return await ReadChunkedAsync(sink, cancellationToken);
            default:
                long read = 0;
                while (Buffered > 0 || await FillAsync(cancellationToken) > 0)
                {
                    sink?.Invoke(_buffer.AsSpan(_start, Buffered));
                    read += Buffered;
                    _start = _end;
                }

                return read;
        }
    }

    /// <summary>Reads one complete response, its body framed by Content-Length or chunks (or absent, for 1xx, 204 and 304).</summary>
    /// <param name="cancellationToken">Bounds the read.</param>
    /// <returns>The response.</returns>
    /// <exception cref="EndOfStreamException">The server closed the connection before a whole response.</exception>
    /// <exception cref="InvalidDataException">The response is malformed, or its body is delimited only by the connection's end.</exception>
    public async Task<RawHttpResponse> ReadResponseAsync(CancellationToken cancellationToken)
    {
        var head = await ReadHeadAsync(cancellationToken)
            ?? throw new EndOfStreamException("The server closed the connection instead of responding.");

        // A body that ends only with the connection cannot be told from one cut short.
        if (head.Framing == BodyFraming.UntilClose)
        {
            throw new InvalidDataException($"A response {head.StatusCode} with neither Content-Length nor chunked Transfer-Encoding.");
        }

        using var body = new MemoryStream(head.ContentLength is { } length and <= int.MaxValue ? (int)length : 0);
        await ReadBodyAsync(head, body.Write, cancellationToken);
        return new RawHttpResponse(head, body.ToArray());
    }

    /// <summary>Reads one complete response within a time limit.</summary>
    /// <param name="timeout">The limit.</param>
    /// <returns>The response.</returns>
    /// <exception cref="TimeoutException">The response did not arrive in time.</exception>
    /// <exception cref="EndOfStreamException">The server closed the connection before a whole response.</exception>
    /// <exception cref="InvalidDataException">The response is malformed.</exception>
    public Task<RawHttpResponse> ReadResponseAsync(TimeSpan timeout) => WithTimeoutAsync(ReadResponseAsync, timeout, "The response");

    /// <summary>Reads and drops up to <paramref name="count"/> bytes, whatever they are.</summary>
    /// <param name="count">How many.</param>
    /// <param name="cancellationToken">Bounds the read.</param>
    /// <returns>How many were dropped: fewer than asked when the server closed the connection first.</returns>
    public async Task<long> SkipAsync(long count, CancellationToken cancellationToken)
    {
        long skipped = 0;
        while (skipped < count && (Buffered > 0 || await FillAsync(cancellationToken) > 0))
        {
            var n = (int)Math.Min(Buffered, count - skipped);
            _start += n;
            skipped += n;
        }

        return skipped;
    }

    /// <summary>Waits for the server to close the connection.</summary>
    /// <param name="cancellationToken">Bounds the wait.</param>
    /// <returns>True when it closed (FIN) or reset (RST) with no further bytes; false when bytes came instead.</returns>
    public async Task<bool> ReadEndAsync(CancellationToken cancellationToken)
    {
        if (Buffered > 0)
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

    /// <summary>Resets the connection: SO_LINGER 0, so the close sends RST instead of FIN.</summary>
    public void Abort()
    {
        try
        {
            Socket.LingerState = new LingerOption(true, 0);
        }
        catch (SocketException)
        {
            // Already reset by the server: disposing is all that is left to do.
        }

        Socket.Dispose();
    }

    /// <inheritdoc />
    public void Dispose() => Socket.Dispose();

    /// <inheritdoc />
    public ValueTask DisposeAsync()
    {
        Socket.Dispose();
        return ValueTask.CompletedTask;
    }

    private async Task<long> ReadChunkedAsync(BodySink? sink, CancellationToken cancellationToken)
    {
        long total = 0;
        while (true)
        {
            var sizeLine = await ReadLineAsync(cancellationToken)
                ?? throw new EndOfStreamException("The server closed the connection inside a chunked body.");
            var semicolon = sizeLine.IndexOf(';', StringComparison.Ordinal);
            if (!long.TryParse(semicolon >= 0 ? sizeLine[..semicolon] : sizeLine, NumberStyles.HexNumber, CultureInfo.InvariantCulture, out var size)
                || size < 0)
            {
                throw new InvalidDataException($"Not a chunk size: '{sizeLine}'.");
            }

            if (size == 0)
            {
                // No server under test sends trailer fields in HTTP/1.1: the last chunk is followed by the empty line.
                var end = await ReadLineAsync(cancellationToken)
                    ?? throw new EndOfStreamException("The server closed the connection after the last chunk, before its CRLF.");
                return end.Length == 0 ? total : throw new InvalidDataException($"Trailer fields after the last chunk: '{end}'.");
            }

            await ReadExactlyAsync(size, sink, cancellationToken);
            total += size;
            var crlf = await ReadLineAsync(cancellationToken)
                ?? throw new EndOfStreamException("The server closed the connection after a chunk's data, before its CRLF.");
            if (crlf.Length != 0)
            {
                throw new InvalidDataException("A chunk did not end with CRLF.");
            }
        }
    }

    // A line without its CRLF; null when the server closed the connection with no complete line buffered.
    private async Task<string?> ReadLineAsync(CancellationToken cancellationToken)
    {
        var searched = 0;
        while (true)
        {
            var lf = _buffer.AsSpan(_start + searched, Buffered - searched).IndexOf((byte)'\n');
            if (lf >= 0)
            {
                lf += searched;
                if (lf == 0 || _buffer[_start + lf - 1] != '\r')
                {
                    throw new InvalidDataException("A line ended with a bare LF.");
                }

                var line = Encoding.ASCII.GetString(_buffer, _start, lf - 1);
                _start += lf + 1;
                return line;
            }

            searched = Buffered;
            if (await FillAsync(cancellationToken) == 0)
            {
                return null;
            }
        }
    }

    private async Task ReadExactlyAsync(long count, BodySink? sink, CancellationToken cancellationToken)
    {
        while (count > 0)
        {
            if (Buffered == 0 && await FillAsync(cancellationToken) == 0)
            {
                throw new EndOfStreamException($"The server closed the connection {count} bytes short of a body.");
            }

            var n = (int)Math.Min(Buffered, count);
            sink?.Invoke(_buffer.AsSpan(_start, n));
            _start += n;
            count -= n;
        }
    }

    // Appends what the socket has to the buffer, making room first; returns 0 at the end of the stream.
    private async Task<int> FillAsync(CancellationToken cancellationToken)
    {
        if (_start == _end)
        {
            _start = _end = 0;
        }
        else if (_start > 0)
        {
            Buffer.BlockCopy(_buffer, _start, _buffer, 0, _end - _start);
            _end -= _start;
            _start = 0;
        }

        if (_end == _buffer.Length)
        {
            // Only a line (a head's, or a chunk size) fills the buffer: bodies are consumed as they come.
            if (_buffer.Length == _maxBufferSize)
            {
                throw new InvalidDataException($"A response line longer than the {_maxBufferSize}-byte buffer.");
            }

            Array.Resize(ref _buffer, (int)Math.Min(_maxBufferSize, 2L * _buffer.Length));
        }

        var read = await Socket.ReceiveAsync(_buffer.AsMemory(_end), SocketFlags.None, cancellationToken);
        _end += read;
        return read;
    }

    // Turns the cancellation of a time limit into a TimeoutException that says what was pending, as the
    // tests' own bounds do, so a hang reads differently from a cancellation the caller asked for.
    private async Task<T> WithTimeoutAsync<T>(Func<CancellationToken, Task<T>> operation, TimeSpan timeout, string what)
    {
        using var cts = new CancellationTokenSource(timeout);
        try
        {
            return await operation(cts.Token);
        }
        catch (OperationCanceledException) when (cts.IsCancellationRequested)
        {
            throw new TimeoutException($"{what} did not complete within {timeout}; {Buffered} received bytes were buffered unread.");
        }
    }
}
