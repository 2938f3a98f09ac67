using Soak;

// The soak test's two halves in one program (see benchmarks/soak.sh and benchmarks/README.md):
//   Soak server --transport linux|sockets --port N
//   Soak client --url http://127.0.0.1:N --server-pid PID --seconds S --csv FILE --json FILE [--seed N]
return args.Length > 0 && args[0] == "server"
    ? await SoakServer.RunAsync(args[1..])
    : args.Length > 0 && args[0] == "client"
        ? await SoakClient.RunAsync(args[1..])
        : Usage();

static int Usage()
{
    Console.Error.WriteLine("usage: Soak server --transport linux|sockets --port N");
    Console.Error.WriteLine("       Soak client --url http://127.0.0.1:N --server-pid PID --seconds S --csv FILE --json FILE [--seed N] [--sample-every S]");
    return 2;
}
