using System.Net;
using System.Net.Sockets;
using System.Text;
using LibuvComparator.Internal;
using Microsoft.AspNetCore.Builder;
using Microsoft.AspNetCore.Connections;
using Microsoft.AspNetCore.Hosting;
using Microsoft.AspNetCore.Http;
using Microsoft.Extensions.DependencyInjection;
using Microsoft.Extensions.Logging;

namespace LibuvComparator.Tests;

/// <summary>A real Kestrel host over UseLibuvComparator, spoken to over loopback.</summary>
public sealed class HostTests : IAsyncLifetime
{
    private const int LargeBodySize = 10 * 1024 * 1024;
    private static readonly TimeSpan s_timeout = TimeSpan.FromSeconds(30);

    private WebApplication _app = null!;
    private IPEndPoint _endPoint = null!;

    public async Task InitializeAsync()
    {
        var builder = WebApplication.CreateSlimBuilder();
        builder.Logging.ClearProviders();
        builder.WebHost.UseKestrel(options => options.Listen(IPAddress.Loopback, 0));
        builder.WebHost.UseLibuvComparator(options => options.ThreadCount = 2);
        _app = builder.Build();
        _app.Run(HandleAsync);
        await _app.StartAsync();
        _endPoint = new IPEndPoint(IPAddress.Loopback, new Uri(_app.Urls.Single()).Port);
    }

    public async Task DisposeAsync() => await _app.DisposeAsync();

    private static async Task HandleAsync(HttpContext context)
    {
        if (context.Request.Path == "/large")
        {
            context.Response.ContentLength = LargeBodySize;
            byte[] chunk = new byte[64 * 1024];
            for (int offset = 0; offset < LargeBodySize; offset += chunk.Length)
            {
                for (int i = 0; i < chunk.Length; i++)
                {
                    chunk[i] = Pattern(offset + i);
                }

                await context.Response.Body.WriteAsync(chunk);
            }

            return;
        }

        byte[] hello = Encoding.UTF8.GetBytes($"Hello, World! {context.Request.Path}");
        context.Response.ContentType = "text/plain";
        context.Response.ContentLength = hello.Length;
        await context.Response.Body.WriteAsync(hello);
    }

    private static byte Pattern(int index) => (byte)(index % 251);

    [Fact]
    public void Kestrel_uses_the_comparator_and_reports_the_real_port()
    {
        Assert.NotEqual(0, _endPoint.Port);
        var factories = _app.Services.GetServices<IConnectionListenerFactory>().ToList();
        Assert.IsType<LibuvTransportFactory>(factories[^1]);
        Assert.Equal(2, ((LibuvTransportFactory)factories[^1]).Loops.Count);
    }

    [Fact]
    public async Task Keep_alive_serves_several_requests_on_one_connection()
    {
        using var client = await ConnectAsync();
        var reader = new RawHttpConnection(client);
        for (int i = 0; i < 5; i++)
        {
            await client.SendAsync(Encoding.ASCII.GetBytes($"GET /k{i} HTTP/1.1\r\nHost: test\r\n\r\n"));
            var response = await reader.ReadResponseAsync(s_timeout);
            Assert.Equal(200, response.StatusCode);
            Assert.Equal($"Hello, World! /k{i}", response.BodyText);
        }
    }

    [Fact]
    public async Task Sixteen_pipelined_requests_get_sixteen_responses_in_order()
    {
        using var client = await ConnectAsync();
        var requests = new StringBuilder();
        for (int i = 0; i < 16; i++)
        {
            requests.Append(System.Globalization.CultureInfo.InvariantCulture, $"GET /p{i} HTTP/1.1\r\nHost: test\r\n\r\n");
        }

        // One write, as TechEmpower's plaintext clients send them.
        await client.SendAsync(Encoding.ASCII.GetBytes(requests.ToString()));
        var reader = new RawHttpConnection(client);
        for (int i = 0; i < 16; i++)
        {
            var response = await reader.ReadResponseAsync(s_timeout);
            Assert.Equal(200, response.StatusCode);
            Assert.Equal($"Hello, World! /p{i}", response.BodyText);
        }
    }

    [Fact]
    public async Task A_10_MB_response_arrives_intact()
    {
        using var http = new HttpClient { Timeout = s_timeout };
        byte[] body = await http.GetByteArrayAsync($"http://127.0.0.1:{_endPoint.Port}/large");
        Assert.Equal(LargeBodySize, body.Length);
        for (int i = 0; i < body.Length; i++)
        {
            if (body[i] != Pattern(i))
            {
                Assert.Fail($"Byte {i} is {body[i]}, expected {Pattern(i)}.");
            }
        }
    }

    [Fact]
    public async Task Disposing_the_host_ends_every_loop_thread()
    {
        var factory = _app.Services.GetServices<IConnectionListenerFactory>().OfType<LibuvTransportFactory>().Single();
        var threads = factory.Loops.Select(static l => l.Thread).ToArray();
        Assert.Equal(2, threads.Length);
        Assert.All(threads, static t => Assert.True(t.IsAlive));

        // An idle keep-alive connection is still open when the host stops.
        using var client = await ConnectAsync();
        await client.SendAsync(Encoding.ASCII.GetBytes("GET / HTTP/1.1\r\nHost: test\r\n\r\n"));
        await new RawHttpConnection(client).ReadResponseAsync(s_timeout);

        await _app.StopAsync().WaitAsync(s_timeout);
        await _app.DisposeAsync().AsTask().WaitAsync(s_timeout);

        Assert.All(threads, static t => Assert.False(t.IsAlive));
        Assert.Empty(factory.Loops);
    }

    private async Task<Socket> ConnectAsync()
    {
        var socket = new Socket(AddressFamily.InterNetwork, SocketType.Stream, ProtocolType.Tcp);
        await socket.ConnectAsync(_endPoint);
        return socket;
    }
}
