using System.Diagnostics.CodeAnalysis;
using System.Globalization;
using Kestrel.Transport.Linux;
using Microsoft.AspNetCore.Server.Kestrel.Core;

namespace TechEmpower;

/// <summary>The transport the sample runs Kestrel on.</summary>
public enum SampleTransport
{
    /// <summary>Kestrel.Transport.Linux (the default).</summary>
    Linux,

    /// <summary>Kestrel's built-in Sockets transport with its default options.</summary>
    Sockets,

    /// <summary>
    /// The Sockets transport tuned as TechEmpower's aspnetcore entry runs it:
    /// <c>UnsafePreferInlineScheduling</c> plus <c>DOTNET_SYSTEM_NET_SOCKETS_INLINE_COMPLETIONS=1</c>.
    /// </summary>
    SocketsInline,

    /// <summary>The libuv comparator (benchmarks/LibuvComparator), a libuv-based transport for comparison.</summary>
    Libuv,
}

/// <summary>Where application continuations run.</summary>
public enum SampleScheduling
{
    /// <summary>Continuations are queued to the .NET thread pool.</summary>
    ThreadPool,

    /// <summary>
    /// Continuations run on the I/O thread: the Linux transport's Inline mode, or the Sockets
    /// transport's <c>UnsafePreferInlineScheduling</c> (which is <see cref="SampleTransport.SocketsInline"/>).
    /// </summary>
    Inline,

    /// <summary>The Linux transport's Adaptive mode: on the loop thread while quick, moved off it when blocking.</summary>
    Adaptive,
}

/// <summary>What serves the requests.</summary>
public enum SampleMode
{
    /// <summary>
    /// Kestrel's HTTP stack: /plaintext and /json as a terminal middleware in front of MVC, which serves
    /// /text, /json-object, /xml, /html and /api/test.
    /// </summary>
    Middleware,

    /// <summary>
    /// A connection handler on the transport's pipes that parses HTTP/1.1 itself (as TechEmpower's
    /// platform entries do): /plaintext and /json only.
    /// </summary>
    Platform,
}

/// <summary>
/// The sample's command line: <c>--urls</c>, <c>--transport</c>, <c>--threads</c>, <c>--scheduling</c>,
/// <c>--io</c>, <c>--tuning</c>, <c>--mode</c>, <c>--protocols</c>, <c>--certificate</c>, <c>--certificate-key</c>,
/// <c>--certificate-password</c>, <c>--downstream</c>, <c>--help</c>. Both <c>--name value</c> and <c>--name=value</c> are accepted; a repeated
/// option keeps its last value. Unknown options, unknown values and contradictory combinations are errors.
/// </summary>
public sealed class SampleOptions
{
    /// <summary>The URLs served when <c>--urls</c> is not given.</summary>
    public const string DefaultUrls = "http://*:8080";

    /// <summary>The largest accepted <c>--threads</c> value (the Linux transport's own limit).</summary>
    public const int MaxThreads = 1024;

    /// <summary>The exit code for a command line that cannot be parsed.</summary>
    public const int UsageExitCode = 2;

    /// <summary>The text printed by <c>--help</c> and after a command-line error.</summary>
    public const string Usage =
        """
        Usage: TechEmpower [options]

          --urls URL[;URL...]        Addresses to listen on (default: http://*:8080). Forms:
                                     http://*:PORT, http://localhost:PORT, http://IPv4:PORT,
                                     http://[IPv6]:PORT, http://unix:/PATH, and the same TCP forms
                                     with https:// (TLS; middleware mode only). Port 0 picks a free
                                     port; the startup line prints the bound addresses.
          --transport NAME           linux (default): Kestrel.Transport.Linux;
                                     sockets: Kestrel's Sockets transport, default options;
                                     sockets-inline: Sockets with UnsafePreferInlineScheduling and
                                       DOTNET_SYSTEM_NET_SOCKETS_INLINE_COMPLETIONS=1 (TechEmpower's tuning);
                                     libuv: the libuv comparator (needs libuv1 installed).
          --threads N                linux: ThreadCount (event-loop threads); sockets, sockets-inline:
                                     IOQueueCount; libuv: ThreadCount. Default: the transport's own.
          --scheduling threadpool|inline|adaptive
                                     linux: ApplicationSchedulingMode (default: the transport's).
                                     sockets: inline means sockets-inline. Not for libuv.
          --io epoll|aio|io_uring|auto
                                     linux: IoBackend. epoll: readv/sendmsg per socket; aio: each
                                     pass's batches as one Linux AIO io_submit; io_uring: a ring
                                     per loop (fails to start where io_uring is blocked); auto:
                                     io_uring where allowed, else epoll. Default: the transport's.
          --mode middleware|platform middleware (default): Kestrel's HTTP stack; /plaintext and /json
                                       as terminal middleware, then MVC for /text, /json-object, /xml,
                                       /html and /api/test.
                                     platform: a connection handler that parses HTTP/1.1 on the
                                       transport's pipes; /plaintext and /json only.
          --protocols http1|http2|http1andhttp2
                                     middleware mode: the endpoints' HTTP versions (Kestrel's
                                     ListenOptions.Protocols). http2 serves HTTP/2 with prior
                                     knowledge (h2c) only, which gRPC and h2load need; without TLS
                                     Kestrel serves http1andhttp2 (its default) as HTTP/1.1 only.
                                     Over https:// they are what ALPN offers: h2 and http/1.1 by
                                     default, one of them with http1 or http2.
          --certificate PATH         https://: the server certificate, a PFX (PKCS#12) file, or a PEM
                                     file (with its key in it, or in --certificate-key). Default: a
                                     self-signed ECDSA P-256 certificate for localhost, 127.0.0.1
                                     and ::1, made in memory at start-up.
          --certificate-key PATH     The PEM private key of a PEM --certificate.
          --certificate-password PW  The PFX's password, or the PEM key's if it is encrypted.
          --downstream URL           middleware mode: GET /await calls this http:// or https:// URL
                                     once per request (a shared, pooled HttpClient), awaits it and
                                     answers with its body and content type; 502 if it fails.
                                     Without it /await is not served (404).
          --tuning NAME=VALUE[,...]  linux, for benchmarks only: sets the transport's internal measurement
                                     switches (DeferSend, SendFromThreadPool, CoalesceThreadPoolSends,
                                     MaxBytesPerRead, SchedBatchLoops, TcpQuickAck,
                                     TcpNotSentLowAtBytes, UseNativeEngine, ZeroCopyWhenKernelCopies),
                                     which no configuration reaches.
          -h, --help                 Show this help.

        Other Linux transport options bind from configuration, for example the environment variable
        Kestrel__LinuxTransport__SpinBeforeSleepMicroseconds=50.
        """;

    /// <summary>The URLs to listen on, as given, separated by ';'.</summary>
    public string Urls { get; private set; } = DefaultUrls;

    /// <summary>The parsed form of <see cref="Urls"/>.</summary>
    public IReadOnlyList<ListenUrl> ListenUrls { get; private set; } = [];

    /// <summary>The transport to use.</summary>
    public SampleTransport Transport { get; private set; } = SampleTransport.Linux;

    /// <summary>The number of I/O threads, or null for the transport's default.</summary>
    public int? Threads { get; private set; }

    /// <summary>
    /// The scheduling mode, or null for the transport's default. Always <see cref="SampleScheduling.Inline"/>
    /// for <see cref="SampleTransport.SocketsInline"/>.
    /// </summary>
    public SampleScheduling? Scheduling { get; private set; }

    /// <summary>What serves the requests.</summary>
    public SampleMode Mode { get; private set; } = SampleMode.Middleware;

    /// <summary>The endpoints' HTTP versions in middleware mode, or null for Kestrel's default.</summary>
    public HttpProtocols? Protocols { get; private set; }

    /// <summary>The path of the server certificate (PFX or PEM) for https:// URLs, or null for a self-signed one.</summary>
    public string? Certificate { get; private set; }

    /// <summary>The path of a PEM <see cref="Certificate"/>'s private key, or null when the certificate file holds it.</summary>
    public string? CertificateKey { get; private set; }

    /// <summary>The PFX's password, or an encrypted PEM key's; null when none was given.</summary>
    public string? CertificatePassword { get; private set; }

    /// <summary>The URL that GET /await calls for each request, or null: then /await is not served.</summary>
    public Uri? Downstream { get; private set; }

    /// <summary>True when one of <see cref="ListenUrls"/> is https://.</summary>
    public bool UsesHttps => ListenUrls.Any(static u => u.IsHttps);

    /// <summary>The Linux transport's I/O backend, or null for its default.</summary>
    public IoBackend? Io { get; private set; }

    /// <summary>
    /// The Linux transport's internal measurement switches as <c>Name=value</c> pairs (benchmarks/lib/ablation.txt),
    /// checked when parsed; null when not given.
    /// </summary>
    public string? Tuning { get; private set; }

    /// <summary>True when <c>--help</c> was given: print <see cref="Usage"/> and exit 0.</summary>
    public bool ShowHelp { get; private set; }

    /// <summary>The transport's name as the command line spells it.</summary>
    public string TransportName => Transport switch
    {
        SampleTransport.Sockets => "sockets",
        SampleTransport.SocketsInline => "sockets-inline",
        SampleTransport.Libuv => "libuv",
        _ => "linux",
    };

    /// <summary>The mode's name as the command line spells it.</summary>
    public string ModeName => Mode == SampleMode.Platform ? "platform" : "middleware";

    /// <summary>Parses the command line.</summary>
    /// <param name="args">The arguments, without the program name.</param>
    /// <param name="options">The parsed options, when parsing succeeded.</param>
    /// <param name="error">A one-line message naming the bad argument, when parsing failed.</param>
    /// <returns>True when every argument was understood.</returns>
    public static bool TryParse(
        IReadOnlyList<string> args,
        [NotNullWhen(true)] out SampleOptions? options,
        [NotNullWhen(false)] out string? error)
    {
        ArgumentNullException.ThrowIfNull(args);

        var result = new SampleOptions();
        options = null;
        error = null;

        for (var i = 0; i < args.Count; i++)
        {
            var arg = args[i];
            if (arg is "-h" or "--help" or "-?")
            {
                result.ShowHelp = true;
                continue;
            }

            if (!arg.StartsWith("--", StringComparison.Ordinal) || arg.Length == 2)
            {
                error = $"Unexpected argument '{arg}'.";
                return false;
            }

            string name;
            string? value;
            var equals = arg.IndexOf('=', StringComparison.Ordinal);
            if (equals >= 0)
            {
                name = arg[2..equals];
                value = arg[(equals + 1)..];
            }
            else
            {
                name = arg[2..];
                value = i + 1 < args.Count ? args[++i] : null;
            }

            if (value is null)
            {
                error = $"Option '--{name}' needs a value.";
                return false;
            }

            switch (name.ToUpperInvariant())
            {
                case "URLS":
                    if (string.IsNullOrWhiteSpace(value))
                    {
                        error = "Option '--urls' needs at least one URL.";
                        return false;
                    }

                    result.Urls = value;
                    break;

                case "TRANSPORT":
                    switch (value.ToUpperInvariant())
                    {
                        case "LINUX":
                            result.Transport = SampleTransport.Linux;
                            break;
                        case "SOCKETS":
                            result.Transport = SampleTransport.Sockets;
                            break;
                        case "SOCKETS-INLINE":
                            result.Transport = SampleTransport.SocketsInline;
                            break;
                        case "LIBUV":
                            result.Transport = SampleTransport.Libuv;
                            break;
                        default:
                            error = $"Unknown transport '{value}': expected 'linux', 'sockets', 'sockets-inline' or 'libuv'.";
                            return false;
                    }

                    break;

                case "THREADS":
                    if (!int.TryParse(value, NumberStyles.None, CultureInfo.InvariantCulture, out var threads)
                        || threads is < 1 or > MaxThreads)
                    {
                        error = $"Invalid thread count '{value}': expected a whole number from 1 to {MaxThreads}.";
                        return false;
                    }

                    result.Threads = threads;
                    break;

                case "SCHEDULING":
                    switch (value.ToUpperInvariant())
                    {
                        case "THREADPOOL":
                            result.Scheduling = SampleScheduling.ThreadPool;
                            break;
                        case "INLINE":
                            result.Scheduling = SampleScheduling.Inline;
                            break;
                        case "ADAPTIVE":
                            result.Scheduling = SampleScheduling.Adaptive;
                            break;
                        default:
                            error = $"Unknown scheduling '{value}': expected 'threadpool', 'inline' or 'adaptive'.";
                            return false;
                    }

                    break;

                case "MODE":
                    switch (value.ToUpperInvariant())
                    {
                        case "MIDDLEWARE":
                            result.Mode = SampleMode.Middleware;
                            break;
                        case "PLATFORM":
                            result.Mode = SampleMode.Platform;
                            break;
                        default:
                            error = $"Unknown mode '{value}': expected 'middleware' or 'platform'.";
                            return false;
                    }

                    break;

                case "PROTOCOLS":
                    switch (value.ToUpperInvariant())
                    {
                        case "HTTP1":
                            result.Protocols = HttpProtocols.Http1;
                            break;
                        case "HTTP2":
                            result.Protocols = HttpProtocols.Http2;
                            break;
                        case "HTTP1ANDHTTP2":
                            result.Protocols = HttpProtocols.Http1AndHttp2;
                            break;
                        default:
                            error = $"Unknown protocols '{value}': expected 'http1', 'http2' or 'http1andhttp2'.";
                            return false;
                    }

                    break;

                case "IO":
                    switch (value.ToUpperInvariant())
                    {
                        case "EPOLL":
                            result.Io = IoBackend.Epoll;
                            break;
                        case "AIO":
                            result.Io = IoBackend.EpollAio;
                            break;
                        case "IO_URING":
                            result.Io = IoBackend.IoUring;
                            break;
                        case "AUTO":
                            result.Io = IoBackend.Auto;
                            break;
                        default:
                            error = $"Unknown I/O backend '{value}': expected 'epoll', 'aio', 'io_uring' or 'auto'.";
                            return false;
                    }

                    break;

                case "CERTIFICATE":
                    if (string.IsNullOrWhiteSpace(value))
                    {
                        error = "Option '--certificate' needs a file path.";
                        return false;
                    }

                    result.Certificate = value;
                    break;

                case "CERTIFICATE-KEY":
                    if (string.IsNullOrWhiteSpace(value))
                    {
                        error = "Option '--certificate-key' needs a file path.";
                        return false;
                    }

                    result.CertificateKey = value;
                    break;

                case "CERTIFICATE-PASSWORD":
                    // An empty password is a password: PFX files are often exported with one.
                    result.CertificatePassword = value;
                    break;

                case "DOWNSTREAM":
                    if (!Uri.TryCreate(value, UriKind.Absolute, out var downstream)
                        || (downstream.Scheme != Uri.UriSchemeHttp && downstream.Scheme != Uri.UriSchemeHttps))
                    {
                        error = $"Invalid downstream '{value}': expected an absolute http:// or https:// URL, such as http://127.0.0.1:8081/json.";
                        return false;
                    }

                    result.Downstream = downstream;
                    break;

                case "TUNING":
                    if (TransportTuning.Check(value) is { } tuningError)
                    {
                        error = $"Invalid '--tuning {value}': {tuningError}";
                        return false;
                    }

                    result.Tuning = value;
                    break;

                default:
                    error = $"Unknown option '--{name}'.";
                    return false;
            }
        }

        if (result.Transport != SampleTransport.Linux && (result.Io is not null || result.Tuning is not null))
        {
            error = $"Options '--io' and '--tuning' apply to the linux transport only, not to '{result.TransportName}'.";
            return false;
        }

        if (result.Mode == SampleMode.Platform && result.Protocols is not null)
        {
            error = "Option '--protocols' applies to middleware mode only: platform mode's handler speaks HTTP/1.1 itself.";
            return false;
        }

        // The combinations are checked once every option is known, so their order does not matter.
        switch (result.Transport)
        {
            case SampleTransport.Sockets or SampleTransport.SocketsInline when result.Scheduling == SampleScheduling.Adaptive:
                error = "Scheduling 'adaptive' is the linux transport's; Sockets has 'threadpool' and 'inline' only.";
                return false;

            case SampleTransport.Sockets when result.Scheduling == SampleScheduling.Inline:
                // The older spelling of the same configuration.
                result.Transport = SampleTransport.SocketsInline;
                break;

            case SampleTransport.SocketsInline when result.Scheduling == SampleScheduling.ThreadPool:
                error = "Transport 'sockets-inline' always schedules inline: drop '--scheduling threadpool' or use '--transport sockets'.";
                return false;

            case SampleTransport.SocketsInline:
                result.Scheduling = SampleScheduling.Inline;
                break;

            case SampleTransport.Libuv when result.Scheduling is not null:
                error = "Option '--scheduling' does not apply to the libuv transport.";
                return false;
        }

        if (!ListenUrl.TryParseList(result.Urls, out var listenUrls, out error))
        {
            return false;
        }

        result.ListenUrls = listenUrls;
        if (CheckTlsAndDownstream(result) is { } conflict)
        {
            error = conflict;
            return false;
        }

        options = result;
        return true;
    }

    private static string? CheckTlsAndDownstream(SampleOptions result)
    {
        if (result.Mode == SampleMode.Platform && result.UsesHttps)
        {
            // Its handler reads HTTP/1.1 straight off the transport's pipes, and TechEmpower's platform tests are plaintext.
            return "Platform mode serves plain HTTP only (TechEmpower's platform tests are plaintext): use http:// URLs, "
                + "or '--mode middleware' for https://.";
        }

        if (result.Mode == SampleMode.Platform && result.Downstream is not null)
        {
            return "Option '--downstream' applies to middleware mode only: GET /await is a middleware-mode endpoint.";
        }

        if (result.Certificate is null && (result.CertificateKey is not null || result.CertificatePassword is not null))
        {
            return "Options '--certificate-key' and '--certificate-password' need '--certificate'.";
        }

        if (result.Certificate is not null && !result.UsesHttps)
        {
            return "Option '--certificate' needs an https:// URL in '--urls': no endpoint would use it.";
        }

        return null;
    }
}
