using System.Net;
using System.Net.Sockets;

namespace Kestrel.Transport.Linux.Microbenchmarks.Http;

/// <summary>
/// One keep-alive client connection with blocking, synchronous socket calls. Synchronous on purpose: the
/// client then never queues thread-pool work, so the work items the threading diagnoser counts are the server's.
/// </summary>
internal sealed class PipelinedConnection : IDisposable
{
    // A stalled server fails the benchmark instead of hanging it.
    private const int TimeoutMilliseconds = 10_000;

    private readonly Socket _socket;
    private readonly byte[] _received;
    private int _receivedLength;

    public PipelinedConnection(IPEndPoint server, int receiveCapacity)
    {
        _socket = new Socket(server.AddressFamily, SocketType.Stream, ProtocolType.Tcp)
        {
            NoDelay = true,
            ReceiveTimeout = TimeoutMilliseconds,
            SendTimeout = TimeoutMilliseconds,
        };
        _socket.Connect(server);
        _received = new byte[receiveCapacity];
    }

    public ReadOnlySpan<byte> Received => _received.AsSpan(0, _receivedLength);

    public void Send(byte[] requests)
    {
        int sent = 0;
        while (sent < requests.Length)
        {
            sent += _socket.Send(requests, sent, requests.Length - sent, SocketFlags.None);
        }
    }

    /// <summary>Reads exactly <paramref name="count"/> bytes; a server that closes early or sends too little throws.</summary>
    public void ReceiveExactly(int count)
    {
        _receivedLength = 0;
        while (_receivedLength < count)
        {
            int n = _socket.Receive(_received, _receivedLength, count - _receivedLength, SocketFlags.None);
            if (n == 0)
            {
                throw new IOException($"The server closed the connection after {_receivedLength} of {count} bytes.");
            }

            _receivedLength += n;
        }
    }

    public void Dispose() => _socket.Dispose();
}
