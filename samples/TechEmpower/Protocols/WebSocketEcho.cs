using System.Buffers;
using System.Net.WebSockets;

namespace TechEmpower.Protocols;

/// <summary>
/// <c>/ws</c>: a WebSocket endpoint that sends every message back as it arrives, for <c>compare.sh --phases
/// protocols</c> (benchmarks/wsload) and the tests. The WebSockets middleware runs on this endpoint's own branch,
/// so no other request pays for it.
/// </summary>
public static class WebSocketEcho
{
    /// <summary>The endpoint's path.</summary>
    public const string Path = "/ws";

    // A message larger than this arrives in several receives and is echoed as as many frames (FIN on the last).
    private const int BufferSize = 16 * 1024;

    /// <summary>Maps the endpoint, with the WebSockets middleware in front of it only.</summary>
    /// <param name="endpoints">The application's endpoints.</param>
    /// <returns>The endpoint's builder.</returns>
    public static IEndpointConventionBuilder Map(IEndpointRouteBuilder endpoints)
    {
        ArgumentNullException.ThrowIfNull(endpoints);
        var branch = endpoints.CreateApplicationBuilder();
        branch.UseWebSockets();
        branch.Run(EchoAsync);

        // Map rather than MapGet: a WebSocket over HTTP/2 (RFC 8441) arrives as CONNECT.
        return endpoints.Map(Path, branch.Build());
    }

    private static async Task EchoAsync(HttpContext context)
    {
        if (!context.WebSockets.IsWebSocketRequest)
        {
            context.Response.StatusCode = StatusCodes.Status400BadRequest;
            return;
        }

        using var socket = await context.WebSockets.AcceptWebSocketAsync();
        var buffer = ArrayPool<byte>.Shared.Rent(BufferSize);
        var aborted = context.RequestAborted;
        try
        {
            while (true)
            {
                var received = await socket.ReceiveAsync(buffer.AsMemory(), aborted);
                if (received.MessageType == WebSocketMessageType.Close)
                {
                    // The client started the closing handshake: answer with its status.
                    await socket.CloseOutputAsync(
                        socket.CloseStatus ?? WebSocketCloseStatus.NormalClosure, socket.CloseStatusDescription, aborted);
                    return;
                }

                await socket.SendAsync(buffer.AsMemory(0, received.Count), received.MessageType, received.EndOfMessage, aborted);
            }
        }
        catch (Exception e) when (e is WebSocketException or OperationCanceledException)
        {
            // The client went away without the closing handshake (a load generator stopped, a test ended):
            // nothing to answer, and nothing worth a log line per connection.
        }
        finally
        {
            ArrayPool<byte>.Shared.Return(buffer);
        }
    }
}
