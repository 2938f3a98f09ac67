using System.Net;
using Microsoft.AspNetCore.Builder;
using Microsoft.AspNetCore.Hosting;
using Microsoft.AspNetCore.Hosting.Server;
using Microsoft.AspNetCore.Hosting.Server.Features;
using Microsoft.Extensions.DependencyInjection;

namespace Kestrel.Transport.Linux.Microbenchmarks.Http;

public enum TransportKind
{
    Sockets,
    Linux,

    /// <summary>benchmarks/LibuvComparator over the system's libuv.so.1; ThreadPool scheduling only.</summary>
    Libuv,
}

public enum SchedulingMode
{
    /// <summary>Application code runs on the thread pool (every transport's default, and libuv's only mode).</summary>
    ThreadPool,

    /// <summary>
    /// Linux: <see cref="ApplicationSchedulingMode.Inline"/>, the app runs on the loop thread.
    /// Sockets: UnsafePreferInlineScheduling, plus inline socket completions (see <see cref="HelloWorldServer"/>).
    /// </summary>
    Inline,
}

/// <summary>An in-process Kestrel on 127.0.0.1, port 0, serving <see cref="HelloWorldApp"/> over the chosen transport.</summary>
internal sealed class HelloWorldServer : IAsyncDisposable
{
    private const string InlineCompletionsVariable = "DOTNET_SYSTEM_NET_SOCKETS_INLINE_COMPLETIONS";

    private readonly WebApplication _app;

    private HelloWorldServer(WebApplication app, IPEndPoint endPoint)
    {
        _app = app;
        EndPoint = endPoint;
    }

    public IPEndPoint EndPoint { get; }

    /// <summary>
    /// Whether the transport has the scheduling mode. The libuv comparator always hands the application to the
    /// thread pool (its loop is the scheduler of the transport's side of each pipe only), so it has no Inline.
    /// </summary>
    public static bool Supports(TransportKind transport, SchedulingMode scheduling)
        => transport != TransportKind.Libuv || scheduling == SchedulingMode.ThreadPool;

    public static async Task<HelloWorldServer> StartAsync(TransportKind transport, int threadCount, SchedulingMode scheduling)
    {
        if (!Supports(transport, scheduling))
        {
            // The suite filters these cases out; reaching here means the filter was bypassed, and measuring the
            // thread-pool mode under an Inline label would be a wrong result, not a slow one.
            throw new NotSupportedException($"The {transport} transport has no {scheduling} scheduling mode.");
        }

        bool inline = scheduling == SchedulingMode.Inline;
        if (transport == TransportKind.Sockets && inline && Environment.GetEnvironmentVariable(InlineCompletionsVariable) is null)
        {
            // As samples/TechEmpower does: UnsafePreferInlineScheduling only removes Kestrel's own hop; the socket
            // engine's completions still go to the thread pool unless this is set. The runtime reads it once, when
            // the process's first socket registers with epoll, so it takes effect in a fresh benchmark process (the
            // default toolchain) but not in a --inProcess run that already served another case.
            Environment.SetEnvironmentVariable(InlineCompletionsVariable, "1");
        }

        // The empty builder: no configuration sources, no logging providers, nothing but Kestrel and one middleware.
        var builder = WebApplication.CreateEmptyBuilder(new WebApplicationOptions());
        builder.WebHost.UseKestrelCore();
        builder.WebHost.ConfigureKestrel(o => o.Listen(IPAddress.Loopback, 0));

        switch (transport)
        {
            case TransportKind.Linux:
                builder.WebHost.UseLinuxTransport(o =>
                {
                    o.ThreadCount = threadCount;
                    o.ApplicationSchedulingMode = inline ? ApplicationSchedulingMode.Inline : ApplicationSchedulingMode.ThreadPool;
                });
                break;
            case TransportKind.Libuv:
                builder.WebHost.UseLibuvComparator(o => o.ThreadCount = threadCount);
                break;
            case TransportKind.Sockets:
                builder.WebHost.UseSockets(o =>
                {
                    o.IOQueueCount = threadCount;
                    o.UnsafePreferInlineScheduling = inline;
                });
                break;
            default:
                throw new ArgumentOutOfRangeException(nameof(transport), transport, null);
        }

        var app = builder.Build();
        app.Run(HelloWorldApp.HandleAsync);
        await app.StartAsync();

        string address = app.Services.GetRequiredService<IServer>().Features.Get<IServerAddressesFeature>()!.Addresses.Single();
        return new HelloWorldServer(app, new IPEndPoint(IPAddress.Loopback, new Uri(address).Port));
    }

    public async ValueTask DisposeAsync()
    {
        await _app.StopAsync();
        await _app.DisposeAsync();
    }
}
