using Kestrel.Transport.Linux.Tests.Infrastructure;
using Microsoft.AspNetCore.Http;

namespace Kestrel.Transport.Linux.Tests.Hosting;

/// <summary>HTTP/1.1 keep-alive and pipelining through Kestrel over the transport.</summary>
public sealed class HttpConnectionReuseTests(ITestOutputHelper output)
{
    // Answers with the connection that carried the request and the request's path.
    private static readonly RequestDelegate s_whoAmI = context =>
    {
        var body = $"{context.Connection.Id} {context.Request.Path}";
        context.Response.ContentLength = body.Length;
        return context.Response.WriteAsync(body);
    };

    [Theory]
    [MemberData(nameof(Transports.HostLevel), MemberType = typeof(Transports))]
    public async Task Sequential_requests_reuse_one_kept_alive_connection(TransportKind kind)
    {
        await using var host = await TestHost.StartAsync(kind, output, s_whoAmI);
        using (var connection = new RawHttpConnection(await TestSockets.ConnectAsync(host.EndPoint)))
        {
            string? connectionId = null;
            for (var i = 0; i < 5; i++)
            {
                await connection.SendAsync(RawHttpRequest.Get($"/keep-alive/{i}"), TestTimeouts.Default);
                var response = await connection.ReadResponseAsync(TestTimeouts.Default);
                Assert.Equal(200, response.StatusCode);
                Assert.False(response.Values("Connection").Count > 0, $"Unexpected Connection header: {string.Join(", ", response.Values("Connection"))}");
                var (id, path) = Split(response.BodyText);
                Assert.Equal($"/keep-alive/{i}", path);
                connectionId ??= id;
                Assert.Equal(connectionId, id);
            }
        }

        await host.StopAsync();
    }

    [Theory]
    [MemberData(nameof(Transports.HostLevel), MemberType = typeof(Transports))]
    public async Task Sixteen_pipelined_requests_in_one_write_get_sixteen_responses_in_order(TransportKind kind)
    {
        await using var host = await TestHost.StartAsync(kind, output, s_whoAmI);
        using (var connection = new RawHttpConnection(await TestSockets.ConnectAsync(host.EndPoint)))
        {
            // Twice: the second batch arrives on a connection that has already been through a full pass.
            for (var batch = 0; batch < 2; batch++)
            {
                await connection.SendAsync(string.Concat(Enumerable.Range(0, 16).Select(i => RawHttpRequest.Get($"/pipelined/{batch}/{i}"))), TestTimeouts.Default);
                string? connectionId = null;
                for (var i = 0; i < 16; i++)
                {
                    var response = await connection.ReadResponseAsync(TestTimeouts.Default);
                    Assert.Equal(200, response.StatusCode);
                    var (id, path) = Split(response.BodyText);
                    Assert.Equal($"/pipelined/{batch}/{i}", path);
                    connectionId ??= id;
                    Assert.Equal(connectionId, id);
                }
            }
        }

        await host.StopAsync();
    }

    private static (string ConnectionId, string Path) Split(string body)
    {
        var space = body.IndexOf(' ', StringComparison.Ordinal);
        Assert.True(space > 0, $"Unexpected body: '{body}'");
        return (body[..space], body[(space + 1)..]);
    }
}
