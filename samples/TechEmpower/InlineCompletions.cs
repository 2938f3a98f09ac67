using System.Net;
using System.Net.Sockets;

namespace TechEmpower;

/// <summary>
/// <c>DOTNET_SYSTEM_NET_SOCKETS_INLINE_COMPLETIONS=1</c> makes .NET run socket completions on its
/// epoll thread instead of the thread pool. The runtime reads the variable once, when the first
/// socket starts its engine, so the sample sets it before any socket exists and then checks, with
/// one loopback receive, where completions really run.
/// </summary>
public static class InlineCompletions
{
    /// <summary>The variable's name.</summary>
    public const string Variable = "DOTNET_SYSTEM_NET_SOCKETS_INLINE_COMPLETIONS";

    // The name .NET gives its socket engine threads (System.Net.Sockets, SocketAsyncEngine.Unix.cs).
    private const string EngineThreadName = ".NET Sockets";

    /// <summary>
    /// Sets the variable to 1 for this process unless the environment already sets it.
    /// Must run before the process creates its first socket.
    /// </summary>
    /// <returns>Null when the variable is 1 now; otherwise the value the environment insists on.</returns>
    public static string? Request()
    {
        var value = Environment.GetEnvironmentVariable(Variable);
        if (value is null)
        {
            Environment.SetEnvironmentVariable(Variable, "1");
            return null;
        }

        return value == "1" ? null : value;
    }

    /// <summary>
    /// Receives one byte over loopback and reports whether the receive's completion ran on the
    /// socket engine's thread, which happens only when inline completions are on.
    /// </summary>
    /// <param name="timeout">How long to wait for the byte.</param>
    /// <returns>True when completions run inline.</returns>
    public static async Task<bool> ProbeAsync(TimeSpan timeout)
    {
        using var listener = new Socket(AddressFamily.InterNetwork, SocketType.Stream, ProtocolType.Tcp);
        listener.Bind(new IPEndPoint(IPAddress.Loopback, 0));
        listener.Listen(1);

        using var client = new Socket(AddressFamily.InterNetwork, SocketType.Stream, ProtocolType.Tcp);
        using var cts = new CancellationTokenSource(timeout);
        var accept = listener.AcceptAsync(cts.Token);
        await client.ConnectAsync(listener.LocalEndPoint!, cts.Token);
        using var server = await accept;

        // The receive starts, and its continuation is attached, before anything is sent: so it
        // pends, and the continuation runs on whichever thread completes it.
        var completedOn = ReceiveOneByteAsync(server, cts.Token);
        await client.SendAsync(new byte[] { 1 }, SocketFlags.None, cts.Token);
        return await completedOn == EngineThreadName;
    }

    private static async Task<string?> ReceiveOneByteAsync(Socket socket, CancellationToken cancellationToken)
    {
        var buffer = new byte[1];
        await socket.ReceiveAsync(buffer, SocketFlags.None, cancellationToken);
        return Thread.CurrentThread.Name;
    }
}
