using System.Net;
using System.Net.Sockets;
using System.Text;
using Microsoft.AspNetCore.Builder;
using Microsoft.AspNetCore.Hosting;
using Microsoft.AspNetCore.Hosting.Server;
using Microsoft.AspNetCore.Hosting.Server.Features;
using Microsoft.AspNetCore.Http;
using Microsoft.AspNetCore.Server.Kestrel.Core;
using Microsoft.Extensions.DependencyInjection;
using Microsoft.Extensions.Logging;

namespace Kestrel.Transport.Linux.Reliability.Tests.PortsAndFiles;

/// <summary>
/// A real Kestrel host over a transport kind, listening where the test says (a fixed port, a Unix socket path),
/// answering every request with its own name, so a test can tell which of two servers served a connection.
/// </summary>
internal sealed class NamedServer : IAsyncDisposable
{
    private readonly WebApplication _app;

    private NamedServer(WebApplication app, string name, IReadOnlyList<string> addresses)
    {
        _app = app;
        Name = name;
        Addresses = addresses;
    }

    public string Name { get; }

    public IReadOnlyList<string> Addresses { get; }

    public static async Task<NamedServer> StartAsync(TransportKind kind, string name, ITestOutputHelper output, Action<KestrelServerOptions> listen)
    {
        kind.AssertEngineAvailable();
        var builder = WebApplication.CreateSlimBuilder();
        builder.Logging.ClearProviders();
        builder.Logging.AddProvider(new TestOutputLoggerProvider(output, LogLevel.Warning));
        builder.WebHost.UseKestrel(listen);
        if (kind.IsLinux())
        {
            builder.WebHost.UseLinuxTransport(options => kind.Configure(options));
        }

        var app = builder.Build();
        app.Run(context => context.Response.WriteAsync(name));
        try
        {
            await app.StartAsync().WaitAsync(TestTimeouts.Default);
        }
        catch
        {
            await app.DisposeAsync();
            throw;
        }

        var addresses = app.Services.GetRequiredService<IServer>().Features.Get<IServerAddressesFeature>()!.Addresses.ToList();
        return new NamedServer(app, name, addresses);
    }

    /// <summary>One GET on a new connection; returns the name of the server that answered.</summary>
    public static async Task<string> AskAsync(EndPoint endPoint)
    {
        using var socket = await TestSockets.ConnectAsync(endPoint);
        await socket.SendAllAsync("GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"u8.ToArray());
        using var cts = new CancellationTokenSource(TestTimeouts.Default);
        var response = await new RawHttpConnection(socket).ReadResponseAsync(cts.Token);
        Assert.Equal(200, response.StatusCode);
        return Encoding.ASCII.GetString(response.Body);
    }

    public static UnixDomainSocketEndPoint Unix(string path) => new(path);

    public async ValueTask DisposeAsync()
    {
        try
        {
            await _app.StopAsync().WaitAsync(TestTimeouts.Default);
        }
        finally
        {
            await _app.DisposeAsync();
        }
    }
}
