using Kestrel.Transport.Linux;
using LibuvComparator;
using Microsoft.AspNetCore.Connections;
using Microsoft.AspNetCore.DataProtection;
using Microsoft.AspNetCore.Hosting.Server;
using Microsoft.AspNetCore.Hosting.Server.Features;
using Microsoft.AspNetCore.Server.Kestrel.Core;
using Microsoft.AspNetCore.Server.Kestrel.Transport.Sockets;
using Microsoft.Extensions.Options;
using System.Security.Cryptography.X509Certificates;
using TechEmpower;
using TechEmpower.Platform;
using TechEmpower.Protocols;
using TechEmpower.Scenarios;

// TechEmpower plaintext and JSON (and the app scenarios of the hosting-model comparisons, a gRPC service
// and a WebSocket echo) on Kestrel, over the Linux transport by default. Run with --help for the options.

ThreadPoolLog.StartIfRequested();

if (!SampleOptions.TryParse(args, out var options, out var error))
{
    Console.Error.WriteLine($"error: {error}");
    Console.Error.WriteLine();
    Console.Error.WriteLine(SampleOptions.Usage);
    return SampleOptions.UsageExitCode;
}

if (options.ShowHelp)
{
    Console.WriteLine(SampleOptions.Usage);
    return 0;
}

// Before the host, so that it sees the transport's meter created; its line is printed on exit.
using var counters = new TransportCounters();

// The https:// endpoints' certificate, checked before anything starts: a file that does not load is a usage error.
X509Certificate2? certificate = null;
string? certificateText = null;
if (options.UsesHttps)
{
    if (options.Certificate is null)
    {
        certificate = ServerCertificate.CreateSelfSigned();
        certificateText = $"self-signed:{ServerCertificate.KeyName(certificate)}";
    }
    else if (ServerCertificate.TryLoad(options.Certificate, options.CertificateKey, options.CertificatePassword, out certificate, out var certificateError))
    {
        certificateText = $"file:{ServerCertificate.KeyName(certificate)}";
    }
    else
    {
        Console.Error.WriteLine($"error: {certificateError}");
        return SampleOptions.UsageExitCode;
    }
}

// Where the Sockets transport's completions run, checked before Kestrel creates any socket.
string? socketCompletions = null;
if (options.Transport is SampleTransport.Sockets or SampleTransport.SocketsInline)
{
    if (options.Transport == SampleTransport.SocketsInline && InlineCompletions.Request() is { } conflicting)
    {
        Console.Error.WriteLine(
            $"error: transport 'sockets-inline' needs {InlineCompletions.Variable}=1, but the environment sets it to '{conflicting}'.");
        return SampleOptions.UsageExitCode;
    }

    var inline = await InlineCompletions.ProbeAsync(TimeSpan.FromSeconds(10));
    if (options.Transport == SampleTransport.SocketsInline && !inline)
    {
        Console.Error.WriteLine(
            $"error: socket completions still run on the thread pool although {InlineCompletions.Variable}=1 was set "
            + $"inside the process (this runtime read it earlier); start the sample with {InlineCompletions.Variable}=1 "
            + "in its environment.");
        return 1;
    }

    socketCompletions = inline ? "inline" : "threadpool";
}

// The command line is parsed above, so the host gets none of it; configuration still comes from
// environment variables (for example Kestrel__LinuxTransport__SpinBeforeSleepMicroseconds=50).
var builder = WebApplication.CreateSlimBuilder();
string? libuvVersion = null;
builder.Logging.SetMinimumLevel(LogLevel.Warning);

switch (options.Transport)
{
    case SampleTransport.Linux:
        builder.WebHost.UseLinuxTransport(o =>
        {
            if (options.Threads is int threads)
            {
                o.ThreadCount = threads;
            }

            if (options.Scheduling is SampleScheduling scheduling)
            {
                o.ApplicationSchedulingMode = scheduling switch
                {
                    SampleScheduling.Inline => ApplicationSchedulingMode.Inline,
                    SampleScheduling.Adaptive => ApplicationSchedulingMode.Adaptive,
                    _ => ApplicationSchedulingMode.ThreadPool,
                };
            }

            if (options.Io is IoBackend io)
            {
                o.IoBackend = io;
            }

            // Benchmarks only (benchmarks/lib/ablation.txt): the transport's internal switches, which no
            // configuration may set (TransportTuning.cs says how they are reached). Checked when parsed.
            if (options.Tuning is { } tuning)
            {
                _ = TransportTuning.Apply(o, tuning);
            }
        });
        break;

    case SampleTransport.Sockets:
    case SampleTransport.SocketsInline:
        builder.WebHost.UseSockets(o =>
        {
            if (options.Threads is int threads)
            {
                o.IOQueueCount = threads;
            }

            o.UnsafePreferInlineScheduling = options.Transport == SampleTransport.SocketsInline;
        });
        break;

    case SampleTransport.Libuv:
        try
        {
            libuvVersion = LibuvComparatorOptions.LibuvVersion;
        }
        catch (DllNotFoundException)
        {
            Console.Error.WriteLine("error: transport 'libuv' needs libuv.so.1: install it with 'apt-get install libuv1'.");
            return 1;
        }

        builder.WebHost.UseLibuvComparator(o =>
        {
            if (options.Threads is int threads)
            {
                o.ThreadCount = threads;
            }
        });

        break;
}

WebApplication app;
if (options.Mode == SampleMode.Middleware)
{
    builder.WebHost.UseUrls(options.Urls);
    if (options.Protocols is HttpProtocols protocols)
    {
        // Over TLS this is also what ALPN offers: h2 and http/1.1 for Http1AndHttp2.
        builder.WebHost.ConfigureKestrel(kestrel => kestrel.ConfigureEndpointDefaults(listen => listen.Protocols = protocols));
    }

    if (certificate is not null)
    {
        // The slim builder leaves out what binds https:// URLs; with it, every one gets the HTTPS defaults.
        builder.WebHost.UseKestrelHttpsConfiguration();
        builder.WebHost.ConfigureKestrel(kestrel => kestrel.ConfigureHttpsDefaults(https => https.ServerCertificate = certificate));
    }

    // MVC brings antiforgery, which brings Data Protection; the views post nothing, so its keys
    // stay in memory instead of being written to the user's profile on every start.
    builder.Services.AddDataProtection().UseEphemeralDataProtectionProvider();
    builder.Services
        .AddControllersWithViews()
        .AddXmlSerializerFormatters()
        .AddJsonOptions(o => o.JsonSerializerOptions.TypeInfoResolverChain.Insert(0, TechEmpowerJsonContext.Default));

    // Without IgnoreUnknownServices gRPC maps a catch-all /{service}/{method} endpoint, which every two-segment
    // path (/api/test) would then be matched against; the echo service keeps its own /techempower.Echo/{method}
    // one, so that an unknown method of it answers UNIMPLEMENTED, as gRPC clients expect.
    builder.Services.AddGrpc(o => o.IgnoreUnknownServices = true)
        .AddServiceOptions<EchoService>(o => o.IgnoreUnknownServices = false);

    app = builder.Build();

    // Plaintext and JSON first, so they never reach routing or MVC. Routing, authentication and
    // authorization (which MVC registers) are placed explicitly: otherwise WebApplication adds them
    // itself, in front of this middleware.
    app.Use(TechEmpowerMiddleware.Create);
    app.UseRouting();
    app.UseAuthentication();
    app.UseAuthorization();
    app.MapControllers();

    // Not a TechEmpower test: a handler that blocks its thread, for compare.sh's blocking phase.
    app.MapGet(BlockingEndpoint.Path, BlockingEndpoint.Handle);

    // Nor this, for the awaiting-handler scenario: a downstream call per request. Unmapped without --downstream, so
    // that the path answers 404 as on a build without it.
    if (options.Downstream is { } downstream)
    {
        var awaiting = new AwaitEndpoint(downstream);
        app.Lifetime.ApplicationStopped.Register(awaiting.Dispose);
        app.MapGet(AwaitEndpoint.Path, awaiting.Handle);
    }

    // Nor these, for compare.sh's protocols phase: two more routes, which /plaintext and /json never reach.
    app.MapGrpcService<EchoService>();
    WebSocketEcho.Map(app);
}
else
{
    builder.Services.AddSingleton(_ => new DateHeader(TimeProvider.System));
    builder.WebHost.ConfigureKestrel(kestrel =>
    {
        foreach (var url in options.ListenUrls)
        {
            Listen(kestrel, url, listen => listen.UseConnectionHandler<PlatformConnectionHandler>());
        }
    });

    // Kestrel still wants an HTTP application, but every endpoint's connections go to the handler.
    app = builder.Build();
}

try
{
    await app.StartAsync();
}
catch (Exception e) when (e is IOException or InvalidOperationException or DllNotFoundException)
{
    Console.Error.WriteLine($"error: the server did not start: {e.Message}");
    if (e.Message.Contains("unix:", StringComparison.Ordinal))
    {
        // Kestrel's Sockets transport (which also serves libuv's Unix endpoints) never removes a socket
        // file left by a server that was killed; the Linux transport replaces it.
        Console.Error.WriteLine("hint: if no server is running there, remove the stale socket file and start again.");
    }

    return 1;
}

// The hot path logs nothing; this one line says what is running and where (with the real ports
// when the URLs asked for port 0).
var addresses = app.Services.GetRequiredService<IServer>().Features.Get<IServerAddressesFeature>()?.Addresses;
var urls = addresses is { Count: > 0 } ? string.Join(", ", addresses) : options.Urls;
string transport;
switch (options.Transport)
{
    case SampleTransport.Linux:
        var linux = app.Services.GetRequiredService<IOptions<LinuxTransportOptions>>().Value;
        transport = $"transport=linux threads={linux.ThreadCount} scheduling={linux.ApplicationSchedulingMode} io={linux.IoBackend}"
            + (options.Tuning is null ? string.Empty : $" tuning={options.Tuning}");
        break;

    case SampleTransport.Sockets:
    case SampleTransport.SocketsInline:
        var sockets = app.Services.GetRequiredService<IOptions<SocketTransportOptions>>().Value;
        transport = $"transport={options.TransportName} threads={sockets.IOQueueCount} "
            + $"scheduling={(sockets.UnsafePreferInlineScheduling ? "Inline" : "ThreadPool")} socket-completions={socketCompletions}";
        break;

    default:
        var libuv = app.Services.GetRequiredService<IOptions<LibuvComparatorOptions>>().Value;
        transport = $"transport=libuv (libuv {libuvVersion} comparator) threads={libuv.ThreadCount}";
        break;
}

var protocolsText = options.Protocols is { } given ? $" protocols={given}" : string.Empty;
var certificateField = certificateText is null ? string.Empty : $" certificate={certificateText}";
Console.WriteLine($"TechEmpower: {transport} mode={options.ModeName}{protocolsText}{certificateField} urls={urls}");
if (options.Transport == SampleTransport.Libuv && options.ListenUrls.Any(u => u.Kind == ListenUrlKind.UnixSocket))
{
    // The comparator binds IP endpoints only; Kestrel gives the others to its Sockets transport.
    Console.WriteLine("note: the libuv comparator binds IP endpoints only; Unix socket URLs are served by Kestrel's Sockets transport.");
}

await app.WaitForShutdownAsync();

// The host has stopped, so the counters are final; the transport's meter lives until the process ends.
if (counters.ReadLine() is { } countersLine)
{
    Console.WriteLine(countersLine);
}

return 0;

static void Listen(KestrelServerOptions kestrel, ListenUrl url, Action<ListenOptions> configure)
{
    switch (url.Kind)
    {
        case ListenUrlKind.UnixSocket:
            kestrel.ListenUnixSocket(url.SocketPath!, configure);
            break;
        case ListenUrlKind.AnyAddress:
            kestrel.ListenAnyIP(url.Port, configure);
            break;
        case ListenUrlKind.Localhost:
            kestrel.ListenLocalhost(url.Port, configure);
            break;
        default:
            kestrel.Listen(url.Address!, url.Port, configure);
            break;
    }
}
