using System.Net;
using System.Net.Sockets;

namespace Kestrel.Transport.Linux.Tests.Infrastructure;

/// <summary>Client-side socket operations with a bound on every wait.</summary>
internal static class TestSockets
{
    public static async Task<Socket> ConnectAsync(EndPoint endPoint, TimeSpan? timeout = null)
    {
        using var cts = new CancellationTokenSource(timeout ?? TestTimeouts.Default);
        return await ClientSocket.ConnectAsync(endPoint, cts.Token);
    }

    /// <summary>One receive; throws <see cref="TimeoutException"/> when nothing arrives in time.</summary>
    public static async Task<int> ReceiveAsync(this Socket socket, Memory<byte> buffer, TimeSpan timeout)
    {
        using var cts = new CancellationTokenSource(timeout);
        try
        {
            return await socket.ReceiveAsync(buffer, SocketFlags.None, cts.Token);
        }
        catch (OperationCanceledException) when (cts.IsCancellationRequested)
        {
            throw new TimeoutException($"Nothing was received within {timeout}.");
        }
    }

    public static async Task ReceiveExactlyAsync(this Socket socket, Memory<byte> buffer, TimeSpan? timeout = null)
    {
        using var cts = new CancellationTokenSource(timeout ?? TestTimeouts.Default);
        var received = 0;
        try
        {
            while (received < buffer.Length)
            {
                var n = await socket.ReceiveAsync(buffer[received..], SocketFlags.None, cts.Token);
                if (n == 0)
                {
                    throw new EndOfStreamException($"The peer closed after {received} of {buffer.Length} expected bytes.");
                }

                received += n;
            }
        }
        catch (OperationCanceledException) when (cts.IsCancellationRequested)
        {
            throw new TimeoutException($"Only {received} of {buffer.Length} bytes arrived within {timeout ?? TestTimeouts.Default}.");
        }
    }

    public static async Task SendAllAsync(this Socket socket, ReadOnlyMemory<byte> data, TimeSpan? timeout = null)
    {
        using var cts = new CancellationTokenSource(timeout ?? TestTimeouts.Default);
        try
        {
            while (!data.IsEmpty)
            {
                var n = await socket.SendAsync(data, SocketFlags.None, cts.Token);
                data = data[n..];
            }
        }
        catch (OperationCanceledException) when (cts.IsCancellationRequested)
        {
            throw new TimeoutException($"The send did not complete within {timeout ?? TestTimeouts.Default}; {data.Length} bytes were left.");
        }
    }

    /// <summary>Reads until the peer's FIN (a receive returning 0) and returns everything read.</summary>
    public static async Task<byte[]> ReceiveToEndAsync(this Socket socket, TimeSpan? timeout = null)
    {
        using var cts = new CancellationTokenSource(timeout ?? TestTimeouts.Default);
        using var all = new MemoryStream();
        var buffer = new byte[64 * 1024];
        try
        {
            while (true)
            {
                var n = await socket.ReceiveAsync(buffer, SocketFlags.None, cts.Token);
                if (n == 0)
                {
                    return all.ToArray();
                }

                all.Write(buffer, 0, n);
            }
        }
        catch (OperationCanceledException) when (cts.IsCancellationRequested)
        {
            throw new TimeoutException($"No end of stream within {timeout ?? TestTimeouts.Default}; {all.Length} bytes had arrived.");
        }
    }

    /// <summary>Reads until the peer's FIN, hashing as it goes; returns the length and the SHA-256.</summary>
    public static async Task<(long Length, string Sha256)> ReceiveToEndHashedAsync(this Socket socket, TimeSpan timeout)
    {
        using var cts = new CancellationTokenSource(timeout);
        var hash = new StreamHash();
        var buffer = new byte[64 * 1024];
        try
        {
            while (true)
            {
                var n = await socket.ReceiveAsync(buffer, SocketFlags.None, cts.Token);
                if (n == 0)
                {
                    return (hash.Length, hash.Finish());
                }

                hash.Append(buffer.AsSpan(0, n));
            }
        }
        catch (OperationCanceledException) when (cts.IsCancellationRequested)
        {
            throw new TimeoutException($"No end of stream within {timeout}; {hash.Length} bytes had arrived.");
        }
    }

    /// <summary>
    /// True when the connection is refused: nothing listens on the endpoint any more. False when it connects,
    /// or is reset while connecting: it reached a listening socket that closed with it still in the accept
    /// queue, which happens while a server is unbinding.
    /// </summary>
    public static async Task<bool> IsRefusedAsync(EndPoint endPoint)
    {
        try
        {
            using var probe = await ConnectAsync(endPoint, TestTimeouts.Default);
            return false;
        }
        catch (SocketException ex) when (ex.SocketErrorCode == SocketError.ConnectionRefused)
        {
            return true;
        }
        catch (SocketException ex) when (ex.SocketErrorCode == SocketError.ConnectionReset)
        {
            return false;
        }
    }
}
