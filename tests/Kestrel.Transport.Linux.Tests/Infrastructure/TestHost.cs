using System.Net;
using Microsoft.AspNetCore.Builder;
using Microsoft.AspNetCore.Connections;
using Microsoft.AspNetCore.Hosting;
using Microsoft.AspNetCore.Hosting.Server;
using Microsoft.AspNetCore.Hosting.Server.Features;
using Microsoft.AspNetCore.Http;
using Microsoft.AspNetCore.Server.Kestrel.Core;
using Microsoft.Extensions.DependencyInjection;
using Microsoft.Extensions.Logging;

namespace Kestrel.Transport.Linux.Tests.Infrastructure;

/// <summary>What a host test may change about the server it starts.</summary>
internal sealed class TestHostSettings
{
    public Action<ListenOptions>? Listen { get; set; }

    public Action<KestrelServerOptions>? Kestrel { get; set; }

    /// <summary>Applied after the kind's own Linux options (Linux kinds only).</summary>
    public Action<LinuxTransportOptions>? Linux { get; set; }

    public Action<WebApplicationBuilder>? Builder { get; set; }

    /// <summary>Middleware that runs ahead of the test's handler (app.UseWebSockets(), say).</summary>
    public Action<WebApplication>? Middleware { get; set; }
}

/// <summary>
/// A real Kestrel server on 127.0.0.1, port 0, over the transport of the given kind, with the diagnostic
/// memory pool factory registered after Kestrel's own so that every pool comes from it.
/// End a test with <see cref="StopAsync"/>: it stops the host and requires every block back.
/// </summary>
internal sealed class TestHost : IAsyncDisposable
{
    private readonly WebApplication _app;
    private Task? _stopping;
    private bool _stopped;

    private TestHost(WebApplication app, DiagnosticMemoryPoolFactory memoryPool, Uri address)
    {
        _app = app;
        MemoryPool = memoryPool;
        Address = address;
    }

    public DiagnosticMemoryPoolFactory MemoryPool { get; }

    /// <summary>The server's real address, e.g. http://127.0.0.1:41234.</summary>
    public Uri Address { get; }

    public IPEndPoint EndPoint => new(IPAddress.Loopback, Address.Port);

    public WebApplication App => _app;

    public static async Task<TestHost> StartAsync(TransportKind kind, ITestOutputHelper output, RequestDelegate handler, Action<TestHostSettings>? configure = null)
    {
        kind.AssertEngineAvailable();
        var settings = new TestHostSettings();
        configure?.Invoke(settings);
        var memoryPool = new DiagnosticMemoryPoolFactory();

        var builder = WebApplication.CreateSlimBuilder();
        builder.Logging.ClearProviders();
        builder.Logging.SetMinimumLevel(LogLevel.Warning);
        builder.Logging.AddProvider(new TestOutputLoggerProvider(output, LogLevel.Warning));
        builder.WebHost.UseKestrel(options =>
        {
            options.Listen(IPAddress.Loopback, 0, listen => settings.Listen?.Invoke(listen));
            settings.Kestrel?.Invoke(options);
        });

        if (kind.IsLinux())
        {
            builder.WebHost.UseLinuxTransport(options =>
            {
                kind.Configure(options);
                settings.Linux?.Invoke(options);
            });
        }

        // After Kestrel's registration, so this is the factory every pool comes from.
        builder.Services.AddSingleton<IMemoryPoolFactory<byte>>(memoryPool);
        settings.Builder?.Invoke(builder);

        var app = builder.Build();
        settings.Middleware?.Invoke(app);
        app.Run(handler);
        try
        {
            await app.StartAsync().WaitAsync(TestTimeouts.Default);
        }
        catch
        {
            await app.DisposeAsync();
            throw;
        }

        kind.AssertLoopsAsConfigured(app.Services.GetServices<IConnectionListenerFactory>().Last());
        var addresses = app.Services.GetRequiredService<IServer>().Features.Get<IServerAddressesFeature>()!.Addresses;
        // The loopback endpoint every host has; settings.Kestrel may add others (a Unix socket, say).
        var address = new Uri(Assert.Single(addresses, static a => a.Contains("://127.0.0.1:", StringComparison.Ordinal)));
        Assert.NotEqual(0, address.Port);
        return new TestHost(app, memoryPool, address);
    }

    /// <summary>Starts the host's graceful shutdown and returns it without waiting; <see cref="StopAsync"/> then finishes it.</summary>
    public Task BeginStop() => _stopping ??= _app.StopAsync();

    /// <summary>Stops and disposes the host, then requires every memory block back.</summary>
    public async Task StopAsync()
    {
        _stopped = true;
        await BeginStop().WaitAsync(TestTimeouts.Default);
        await _app.DisposeAsync().AsTask().WaitAsync(TestTimeouts.Default);
        Assert.True(MemoryPool.TotalRented > 0, "Nothing was rented from the test's memory pool factory, so the pool check would prove nothing: is it registered where Kestrel and the transport look?");
        MemoryPool.AssertAllReturned();
    }

    public async ValueTask DisposeAsync()
    {
        if (_stopped)
        {
            return;
        }

        try
        {
            await BeginStop().WaitAsync(TestTimeouts.Default);
            await _app.DisposeAsync().AsTask().WaitAsync(TestTimeouts.Default);
        }
        catch (Exception ex) when (ex is not OutOfMemoryException)
        {
            // The test already failed; its own exception is the one to report.
        }
    }
}
