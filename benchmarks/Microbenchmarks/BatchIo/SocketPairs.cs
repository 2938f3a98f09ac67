using System.Net;
using System.Net.Sockets;

namespace Kestrel.Transport.Linux.Microbenchmarks.BatchIo;

public enum SocketKind
{
    /// <summary>socketpair(AF_UNIX, SOCK_STREAM): the cheapest kernel path, so engine overheads show most.</summary>
    UnixStream,

    /// <summary>An accepted 127.0.0.1 TCP connection and its client: what the transport really serves.</summary>
    TcpLoopback,
}

/// <summary>
/// N connected, non-blocking stream socket pairs. <see cref="Local"/> is the end a transport would own (the
/// accepted socket, for TCP); <see cref="Remote"/> is the peer that feeds and drains it.
/// </summary>
internal sealed class SocketPairs : IDisposable
{
    private readonly List<Socket> _owners = [];

    private SocketPairs(int count)
    {
        Local = new int[count];
        Remote = new int[count];
        Array.Fill(Local, -1);
        Array.Fill(Remote, -1);
    }

    public int[] Local { get; }

    public int[] Remote { get; }

    public static SocketPairs Create(SocketKind kind, int count)
    {
        var pairs = new SocketPairs(count);
        try
        {
            if (kind == SocketKind.UnixStream)
            {
                for (int i = 0; i < count; i++)
                {
                    (pairs.Local[i], pairs.Remote[i]) = SocketCalls.CreateUnixStreamPair();
                }
            }
            else
            {
                pairs.ConnectTcp(count);
            }

            return pairs;
        }
        catch
        {
            pairs.Dispose();
            throw;
        }
    }

    private void ConnectTcp(int count)
    {
        // Managed sockets make the connections; only their fds are used afterwards, so the runtime's socket
        // engine never sees them. The sockets stay referenced here because they own (and close) the fds.
        using var listener = new Socket(AddressFamily.InterNetwork, SocketType.Stream, ProtocolType.Tcp);
        listener.Bind(new IPEndPoint(IPAddress.Loopback, 0));
        listener.Listen(count);
        for (int i = 0; i < count; i++)
        {
            var client = new Socket(AddressFamily.InterNetwork, SocketType.Stream, ProtocolType.Tcp);
            _owners.Add(client);
            client.Connect(listener.LocalEndPoint!);
            var accepted = listener.Accept();
            _owners.Add(accepted);

            // As the transport configures what it accepts (TCP_NODELAY on, non-blocking), and the same for the
            // peer, so that a 64-byte send leaves at once instead of waiting for Nagle.
            client.NoDelay = true;
            accepted.NoDelay = true;
            Local[i] = (int)accepted.SafeHandle.DangerousGetHandle();
            Remote[i] = (int)client.SafeHandle.DangerousGetHandle();
            SocketCalls.SetNonBlocking(Local[i]);
            SocketCalls.SetNonBlocking(Remote[i]);
        }
    }

    public void Dispose()
    {
        if (_owners.Count > 0)
        {
            _owners.ForEach(s => s.Dispose());
            _owners.Clear();
            return;
        }

        foreach (int fd in Local.Concat(Remote).Where(fd => fd >= 0))
        {
            SocketCalls.Close(fd);
        }

        Array.Fill(Local, -1);
        Array.Fill(Remote, -1);
    }
}
