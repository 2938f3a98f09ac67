using System.Net;
using System.Net.WebSockets;
using System.Text;

namespace TechEmpower.Tests.Endpoints;

/// <summary>Middleware mode's WebSocket echo (<c>/ws</c>), through .NET's own client.</summary>
public abstract partial class MiddlewareEndpoints<TFixture>
{
    /// <summary>
    /// Sizes on both sides of the frame-length encodings (7-bit up to 125, 16-bit up to 65535, then 64-bit), and one
    /// larger than the sample's 16 KiB receive buffer, which it echoes as several frames of one message.
    /// </summary>
    [Fact]
    public async Task WebSocket_echoes_each_message_with_its_type_and_bytes()
    {
        using var cts = Timeout();
        using var socket = new ClientWebSocket();
        await socket.ConnectAsync(WebSocketUri(), cts.Token);

        var messages = new List<(WebSocketMessageType Type, byte[] Bytes)> { (WebSocketMessageType.Text, "Hello, World!"u8.ToArray()) };
        foreach (var size in new[] { 1, 125, 126, 65535, 65536, 200_000 })
        {
            messages.Add((WebSocketMessageType.Binary, Enumerable.Range(0, size).Select(i => (byte)((i + size) % 251)).ToArray()));
        }

        foreach (var (type, bytes) in messages)
        {
            await socket.SendAsync(bytes.AsMemory(), type, endOfMessage: true, cts.Token);
            var (echoType, echo) = await ReceiveMessageAsync(socket, cts.Token);
            Assert.Equal(type, echoType);
            Assert.Equal(bytes.Length, echo.Length);
            Assert.True(bytes.AsSpan().SequenceEqual(echo), $"The echo of a {bytes.Length}-byte message differs from it.");
        }

        await socket.CloseAsync(WebSocketCloseStatus.NormalClosure, "done", cts.Token);
        Assert.Equal(WebSocketState.Closed, socket.State);
        Assert.Equal(WebSocketCloseStatus.NormalClosure, socket.CloseStatus);
        Assert.Equal("done", socket.CloseStatusDescription);
    }

    [Fact]
    public async Task WebSocket_echoes_a_message_sent_in_fragments_as_one_message()
    {
        using var cts = Timeout();
        using var socket = new ClientWebSocket();
        await socket.ConnectAsync(WebSocketUri(), cts.Token);

        await socket.SendAsync("frag"u8.ToArray().AsMemory(), WebSocketMessageType.Text, endOfMessage: false, cts.Token);
        await socket.SendAsync("ment"u8.ToArray().AsMemory(), WebSocketMessageType.Text, endOfMessage: false, cts.Token);
        await socket.SendAsync("ed"u8.ToArray().AsMemory(), WebSocketMessageType.Text, endOfMessage: true, cts.Token);
        var (type, echo) = await ReceiveMessageAsync(socket, cts.Token);

        Assert.Equal(WebSocketMessageType.Text, type);
        Assert.Equal("fragmented", Encoding.UTF8.GetString(echo));
    }

    [Fact]
    public async Task WebSocket_path_without_an_upgrade_is_400()
    {
        using var response = await Sample.Client.GetAsync(new Uri("/ws", UriKind.Relative));
        Assert.Equal(HttpStatusCode.BadRequest, response.StatusCode);
    }

    private Uri WebSocketUri() => new(string.Concat("ws", Sample.TcpUrl.AsSpan("http".Length), "/ws"));

    private static async Task<(WebSocketMessageType Type, byte[] Bytes)> ReceiveMessageAsync(WebSocket socket, CancellationToken cancellationToken)
    {
        using var message = new MemoryStream();
        var buffer = new byte[8192];
        while (true)
        {
            var received = await socket.ReceiveAsync(buffer.AsMemory(), cancellationToken);
            Assert.NotEqual(WebSocketMessageType.Close, received.MessageType);
            message.Write(buffer, 0, received.Count);
            if (received.EndOfMessage)
            {
                return (received.MessageType, message.ToArray());
            }
        }
    }
}
